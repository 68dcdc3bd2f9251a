"""Rollouts for online RL (GRPO): what a step generates, scores and learns from.

Example::

    from baton.core.rollouts.advantages import group_advantages, rollout_metrics

    result = group_advantages(table.rows, table.weights, num_generations=8)
    metrics = rollout_metrics(table, result, lengths, truncated)
"""
