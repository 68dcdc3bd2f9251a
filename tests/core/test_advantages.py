"""GRPO's advantages and rollout metrics against TRL 1.16's own computation: TRL's
``nanstd`` and the lines of ``GRPOTrainer._generate_and_score_completions`` (its default
``sum_then_normalize``) and ``_generate_single_turn`` (completion lengths), run by torch on
the same rewards, with None and NaN rows, zero-std and unscorable groups.

TRL's ``nanstd`` divides two integer counts for Bessel's correction, which torch does in
float32 even for float64 values: its standard deviations differ from the exact ones by up
to float32's rounding (about 6e-8 relative), in double precision too."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from baton.core.rewards import RewardTable
from baton.core.rollouts.advantages import (
    completion_metrics,
    group_advantages,
    nanmean,
    nanstd,
    reward_metrics,
    rollout_metrics,
)

NAMES = ("accuracy", "format", "mine")
#: TRL's std against ours in double precision: its correction is rounded to float32
STD_REL = 1e-7


def random_table(seed: int, prompts: int, generations: int) -> RewardTable:
    """Rewards of three functions: random values, some None, a group of equal rewards, a
    group nobody scores, a group with one scorable completion, a function that scores
    nothing in some groups."""
    rng = random.Random(seed)
    rows: list[tuple[float | None, ...]] = []
    for prompt in range(prompts):
        for _ in range(generations):
            if prompt == 0:
                row = (1.0, 0.5, 2.0)  # every completion alike: std 0
            elif prompt == 1:
                row = (None, None, None)  # unscorable: NaN reward, advantage 0
            elif prompt == 2:
                row = (None, None, None) if _ else (rng.random(), None, 1.0)
            else:
                row = tuple(
                    None if rng.random() < 0.2 else rng.choice([0.0, 1.0, rng.gauss(0, 2)])
                    for _ in NAMES
                )
            rows.append(row)
    return RewardTable(NAMES, (1.0, 0.5, -0.25), tuple(rows))


def trl_reference(table: RewardTable, generations: int, scale_rewards: str, dtype: Any) -> dict:
    """TRL 1.16's computation, line for line (``sum_then_normalize``), in ``dtype``."""
    import torch
    from trl.trainer.utils import nanstd as trl_nanstd

    rewards_per_func = torch.tensor(
        [[math.nan if v is None else v for v in row] for row in table.rows], dtype=dtype
    )
    weights = torch.tensor(table.weights, dtype=dtype)
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(generations, dim=0)
    if scale_rewards in ["group", "none"]:
        if generations > 1:
            std_rewards = trl_nanstd(rewards.view(-1, generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    else:
        std_rewards = (
            trl_nanstd(rewards).expand_as(rewards)
            if rewards.numel() > 1
            else torch.zeros_like(rewards)
        )
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    advantages = torch.nan_to_num(advantages, nan=0.0)
    metrics = {}
    for i, name in enumerate(table.names):
        metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        metrics[f"rewards/{name}/std"] = trl_nanstd(rewards_per_func[:, i]).item()
    logged = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    logged[unscorable_mask] = torch.nan
    metrics["reward"] = torch.nanmean(logged).item()
    metrics["reward_std"] = trl_nanstd(logged).item()
    metrics["frac_reward_zero_std"] = is_std_zero.float().mean().item()
    return {"rewards": rewards.tolist(), "advantages": advantages.tolist(), "metrics": metrics}


def same(first: float, second: float, rel: float) -> bool:
    if math.isnan(first) or math.isnan(second):
        return math.isnan(first) and math.isnan(second)
    return math.isclose(first, second, rel_tol=rel, abs_tol=rel)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize(("prompts", "generations"), [(8, 4), (6, 2), (3, 1), (1, 5)])
def test_advantages_and_metrics_are_trls(
    scale_rewards: str, prompts: int, generations: int
) -> None:
    import torch

    table = random_table(prompts * 10 + generations, prompts, generations)
    result = group_advantages(table.rows, table.weights, generations, scale_rewards)
    ours = reward_metrics(table, result)
    # TRL's formula in double precision: equal to rounding
    exact = trl_reference(table, generations, scale_rewards, torch.float64)
    assert all(map(same, result.rewards, exact["rewards"], [1e-12] * len(table)))
    assert all(map(same, result.advantages, exact["advantages"], [STD_REL] * len(table)))
    assert set(ours) == set(exact["metrics"])
    for key, value in exact["metrics"].items():
        rel = STD_REL if key.endswith("std") else 1e-12
        assert same(ours[key], value, rel), (key, ours[key], value)
    # as TRL runs it, in float32: within float32's rounding
    single = trl_reference(table, generations, scale_rewards, torch.float32)
    assert all(map(same, result.advantages, single["advantages"], [2e-5] * len(table)))
    for key, value in single["metrics"].items():
        assert same(ours[key], value, 1e-5), (key, ours[key], value)
    # the cases the random table holds, checked as such
    if generations > 1 and prompts > 1:
        unscorable = slice(generations, 2 * generations)
        assert all(math.isnan(r) for r in result.rewards[unscorable])
        assert result.advantages[unscorable] == (0.0,) * generations
        if scale_rewards != "batch":
            assert result.zero_std[:generations] == (True,) * generations


def test_nanmean_and_nanstd_are_trls() -> None:
    import torch
    from trl.trainer.utils import nanstd as trl_nanstd

    rng = random.Random(3)
    for size in (0, 1, 2, 3, 7):
        for nans in range(size + 1):
            values = [rng.gauss(0, 3) for _ in range(size - nans)] + [math.nan] * nans
            rng.shuffle(values)
            tensor = torch.tensor(values, dtype=torch.float64)
            assert same(nanmean(values), torch.nanmean(tensor).item(), 1e-12)
            assert same(nanstd(values), trl_nanstd(tensor).item(), STD_REL)


def test_completion_metrics_are_trls() -> None:
    """TRL's lengths are those of the completion ids (cut after the first EOS, EOS
    included); a completion is clipped when its last id is neither EOS nor padding."""
    import torch

    eos, pad = 0, 1
    rng = random.Random(5)
    completion_ids = []
    for _ in range(12):
        ids = [rng.randrange(2, 50) for _ in range(rng.randrange(1, 9))]
        if rng.random() < 0.6:
            ids.append(eos)
        completion_ids.append(ids)
    lengths = torch.tensor([len(ids) for ids in completion_ids])
    is_truncated = torch.tensor([ids[-1] not in (eos, pad) for ids in completion_ids])
    expected = {
        "completions/mean_length": lengths.float().mean().item(),
        "completions/min_length": lengths.float().min().item(),
        "completions/max_length": lengths.float().max().item(),
        "completions/clipped_ratio": is_truncated.float().mean().item(),
    }
    ours = completion_metrics(
        [len(ids) for ids in completion_ids], [ids[-1] != eos for ids in completion_ids]
    )
    assert set(ours) == set(expected)
    for key, value in expected.items():
        assert same(ours[key], value, 1e-6), key
    table = random_table(0, 3, 4)
    result = group_advantages(table.rows, table.weights, 4)
    both = rollout_metrics(
        table, result, [len(ids) for ids in completion_ids], is_truncated.tolist()
    )
    assert both == reward_metrics(table, result) | ours


def test_bad_shapes_are_refused() -> None:
    table = random_table(0, 3, 4)
    with pytest.raises(ValueError, match="12 completions are not groups of 5"):
        group_advantages(table.rows, table.weights, 5)
    with pytest.raises(ValueError, match="scale_rewards 'all' is not one of group, batch, none"):
        group_advantages(table.rows, table.weights, 4, "all")
    with pytest.raises(ValueError, match="a row of 3 values for 2 weights"):
        group_advantages(table.rows, (1.0, 1.0), 4)
    with pytest.raises(ValueError, match="2 lengths and 1 truncation flags"):
        completion_metrics([1, 2], [True])
