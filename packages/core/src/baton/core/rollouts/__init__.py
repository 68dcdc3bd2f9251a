"""Online RL's pieces that need no framework: the generator seam, rollout records and
the driver's rollout collaborator.

Example::

    from baton.core.rollouts.generator import Completion, Generator, Sampling
    from baton.core.rollouts.collaborator import RolloutRecord, Rollouts
"""
