"""Online RL's rollouts on the training hosts: the ``transformers`` generator, the
reference scorer, the policy the generator is built from and the rollout phase the driver
calls before each step.

Example::

    from baton.backends.rollouts.hf_generator import TransformersGenerator
    from baton.backends.rollouts.phase import RolloutPhase, build_rollout_phase
    from baton.backends.rollouts.policy import policy_directory, policy_spec
    from baton.backends.rollouts.scoring import ReferenceScorer
"""
