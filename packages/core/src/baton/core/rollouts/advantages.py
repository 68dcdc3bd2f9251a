"""GRPO's advantages and the rollout metrics, as TRL 1.16's ``GRPOTrainer`` computes them.

Pure Python (floats in double precision; TRL computes in float32). Example::

    from baton.core.rollouts.advantages import group_advantages, rollout_metrics

    # rows[i][f]: reward function f's value of completion i (None: it cannot score it);
    # the G completions of a prompt are consecutive
    result = group_advantages(table.rows, table.weights, num_generations=4, scale_rewards="group")
    result.rewards          # the weighted sum per completion (NaN where every function gave None)
    result.advantages       # (reward - group mean) / (group std + 1e-4); 0.0 where unscorable
    metrics = rollout_metrics(table, result, lengths=[12, 30, 30, 7], truncated=[0, 1, 1, 0])
    metrics["reward"], metrics["frac_reward_zero_std"], metrics["completions/clipped_ratio"]

TRL's ``multi_objective_aggregation="sum_then_normalize"`` (its default), exactly:

* reward = the weighted sum of the functions' values, None counting 0 (``nansum``); a
  completion that every function leaves None is unscorable: its reward is NaN;
* mean = the mean of the group's rewards (the G completions of one prompt), NaNs left out;
* std (``scale_rewards``): ``group``, the group's standard deviation; ``batch``, the whole
  step's; ``none``, the group's, used only for ``frac_reward_zero_std``. It is TRL's
  ``nanstd``: NaNs left out, Bessel's correction (``n - 1``), NaN for fewer than 2 values;
  G = 1 (or one completion in ``batch``) gives 0;
* advantage = (reward - mean) / (std + 1e-4), or reward - mean for ``none``; NaN (an
  unscorable completion, a group with nothing scorable) becomes 0.

Metrics, TRL's names and meanings (means over the step's completions):

* ``reward``, ``reward_std``: mean and ``nanstd`` of the weighted rewards, unscorable
  completions left out;
* ``rewards/<name>/mean``, ``rewards/<name>/std``: of each function's own values
  (unweighted), its Nones left out (NaN where it scored none);
* ``frac_reward_zero_std``: the fraction of completions whose std (as ``scale_rewards``
  takes it) is 0 (``torch.isclose``: at most 1e-8): groups that teach nothing;
* ``completions/mean_length``, ``/min_length``, ``/max_length``: completion lengths in
  tokens, the end-of-sequence token counted; ``completions/clipped_ratio``: the fraction
  cut at the length limit (no end-of-sequence token).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from baton.core.rewards.scoring import RewardTable

#: ``--scale-rewards``: what the advantage is divided by
SCALE_REWARDS = ("group", "batch", "none")
#: added to the std before dividing (TRL's)
EPSILON = 1e-4
NAN = float("nan")


def nanmean(values: Sequence[float]) -> float:
    """The mean of the values that are not NaN (NaN if none is)."""
    kept = [v for v in values if not math.isnan(v)]
    return math.fsum(kept) / len(kept) if kept else NAN


def nanstd(values: Sequence[float]) -> float:
    """TRL's ``nanstd``: the unbiased standard deviation of the values that are not NaN
    (NaN for fewer than two)."""
    kept = [v for v in values if not math.isnan(v)]
    if len(kept) < 2:
        return NAN
    mean = math.fsum(kept) / len(kept)
    variance = math.fsum((v - mean) ** 2 for v in kept) / len(kept)
    return math.sqrt(variance * len(kept) / (len(kept) - 1))


def _is_zero(std: float) -> bool:
    return not math.isnan(std) and abs(std) <= 1e-8  # torch.isclose(std, 0)


@dataclass(frozen=True)
class Advantages:
    """Per completion: the weighted reward (NaN: unscorable), the advantage, the std it
    was scaled by (as ``scale_rewards`` takes it) and whether that std is 0."""

    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    std: tuple[float, ...]
    zero_std: tuple[bool, ...]


def summed_rewards(rows: Sequence[Sequence[float | None]], weights: Sequence[float]) -> list[float]:
    """Each completion's weighted sum of the functions' values (None counting 0); NaN
    where every function gave None."""
    sums: list[float] = []
    for row in rows:
        if len(row) != len(weights):
            raise ValueError(f"a row of {len(row)} values for {len(weights)} weights")
        scored = [w * v for v, w in zip(row, weights, strict=True) if v is not None]
        sums.append(math.fsum(scored) if scored else NAN)
    return sums


def group_advantages(
    rows: Sequence[Sequence[float | None]],
    weights: Sequence[float],
    num_generations: int,
    scale_rewards: str = "group",
) -> Advantages:
    """GRPO's advantages of a step's completions (``rows[i][f]``: function ``f``'s value of
    completion ``i``; the ``num_generations`` completions of a prompt are consecutive)."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(
            f"scale_rewards {scale_rewards!r} is not one of {', '.join(SCALE_REWARDS)}"
        )
    count = len(rows)
    if num_generations < 1 or count % num_generations:
        raise ValueError(f"{count} completions are not groups of {num_generations}")
    rewards = summed_rewards(rows, weights)
    groups = [rewards[i : i + num_generations] for i in range(0, count, num_generations)]
    means = [nanmean(group) for group in groups for _ in group]
    if scale_rewards == "batch":
        whole = nanstd(rewards) if count > 1 else 0.0
        std = [whole] * count
    else:
        std = [nanstd(group) if num_generations > 1 else 0.0 for group in groups for _ in group]
    advantages: list[float] = []
    for reward, mean, scale in zip(rewards, means, std, strict=True):
        advantage = reward - mean
        if scale_rewards != "none":
            advantage /= scale + EPSILON
        advantages.append(0.0 if math.isnan(advantage) else advantage)
    return Advantages(
        tuple(rewards), tuple(advantages), tuple(std), tuple(_is_zero(s) for s in std)
    )


def _or_nan(value: float | None) -> float:
    return NAN if value is None else float(value)


def reward_metrics(table: RewardTable, result: Advantages) -> dict[str, float]:
    """``reward``, ``reward_std``, ``rewards/<name>/mean|std`` and ``frac_reward_zero_std``."""
    metrics: dict[str, float] = {}
    for column, name in enumerate(table.names):
        values = [_or_nan(row[column]) for row in table.rows]
        metrics[f"rewards/{name}/mean"] = nanmean(values)
        metrics[f"rewards/{name}/std"] = nanstd(values)
    metrics["reward"] = nanmean(result.rewards)
    metrics["reward_std"] = nanstd(result.rewards)
    zero = result.zero_std
    metrics["frac_reward_zero_std"] = sum(zero) / len(zero) if zero else NAN
    return metrics


def completion_metrics(lengths: Sequence[int], truncated: Sequence[bool]) -> dict[str, float]:
    """``completions/mean_length|min_length|max_length`` (tokens) and
    ``completions/clipped_ratio`` (the fraction cut at the length limit)."""
    if not lengths or len(lengths) != len(truncated):
        raise ValueError(f"{len(lengths)} lengths and {len(truncated)} truncation flags")
    return {
        "completions/mean_length": math.fsum(lengths) / len(lengths),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": sum(map(bool, truncated)) / len(truncated),
    }


def rollout_metrics(
    table: RewardTable,
    result: Advantages,
    lengths: Sequence[int],
    truncated: Sequence[bool],
) -> dict[str, float]:
    """Every rollout metric of a step: :func:`reward_metrics` and :func:`completion_metrics`."""
    return reward_metrics(table, result) | completion_metrics(lengths, truncated)
