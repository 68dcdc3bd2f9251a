"""Rollouts for online RL (GRPO): what a step generates, scores and learns from, with no
framework: the generator seam, the group advantages and rollout metrics, and the
driver's rollout collaborator with the records callbacks see.

Example::

    from baton.core.rollouts.advantages import group_advantages, rollout_metrics
    from baton.core.rollouts.collaborator import RolloutRecord, Rollouts
    from baton.core.rollouts.generator import Completion, Generator, Sampling

    result = group_advantages(table.rows, table.weights, num_generations=8)
    metrics = rollout_metrics(table, result, lengths, truncated)
"""
