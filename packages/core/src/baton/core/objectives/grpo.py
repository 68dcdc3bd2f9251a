"""Group relative policy optimisation with TRL's loss family (GRPO, DAPO, Dr. GRPO,
BNPO; GSPO's sequence-level importance sampling), over rollouts.

A step first samples ``num_generations`` completions of each of its prompts with the
policy's current weights, scores them with the reward functions and turns the scores into
group-normalised advantages (``baton.core.rollouts``); each rollout (prompt, then
completion) is one document of a row whose completion tokens are the supervised targets,
carrying the sampling log-probability of each target (``old_logps``), the reference's
(``ref_logps``, when ``beta > 0``) and its advantage (a document value). The loss, TRL
1.16's ``GRPOTrainer._compute_loss`` written once over packed rows:

- ``log_w = logps - old_logps`` per token, or (``importance_sampling_level=sequence``,
  GSPO) its mean over each completion's tokens; ``ratio = exp(log_w)``;
- per token ``-min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A)``, plus
  ``beta * ratio * (exp(ref - logps) - (ref - logps) - 1)`` (k3 KL, with TRL's
  importance-sampling correction) when ``beta > 0``;
- aggregated by ``loss_type``: ``dapo`` and ``bnpo``, the mean over the completion
  tokens of the global batch; ``grpo``, the mean over completions of each one's token
  mean; ``dr_grpo``, the sum over tokens divided by ``max_completion_length`` per
  completion. (TRL normalises ``bnpo`` and ``grpo`` per micro-batch; baton over the global
  batch: the same with one micro-batch, and a step's loss then does not depend on how it
  is split.)

Metrics (TRL's names and meanings): ``clip_ratio/low_mean``, ``clip_ratio/high_mean``,
``clip_ratio/region_mean`` (token means; completion means for sequence-level sampling),
``entropy`` (the mean token entropy at the temperature), ``kl`` (beta > 0).

Example::

    run = ObjectiveRun.of("grpo", num_generations=4, reward=("accuracy",), beta=0.04)
    run.temperature                                    # logps are of logits / this
    terms = run.loss(xp, LossInputs(rows, logps, entropy))
    # rows.values: "old_logps" and "ref_logps" [B, T], "advantages" [B, D]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from baton.core.objectives.array_math import (
    as_float,
    document_sums,
    present_documents,
    to_tokens,
)
from baton.core.objectives.declaration import (
    DataKind,
    LossInputs,
    LossTerms,
    Objective,
    ReferenceUse,
    Rows,
    Setting,
)
from baton.core.objectives.reference_setting import REFERENCE

#: TRL's GRPO loss aggregations this objective computes
GRPO_LOSSES = ("dapo", "grpo", "bnpo", "dr_grpo")
#: the metrics of the loss (means over the global batch)
GRPO_LOSS_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
#: what a step logs from its rollouts besides (``baton.core.rollouts``)
ROLLOUT_METRICS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "timing/generation_s",
    "timing/weight_sync_s",
    "timing/train_s",
)


def _completions(xp: Any, rows: Rows) -> Any:
    """``[B, D]`` float32: 1 for each rollout (document) present."""
    return present_documents(xp, rows.documents)


def grpo_items(xp: Any, rows: Rows, settings: Mapping[str, Any]) -> Any:
    """What the loss is a mean over: completion tokens (dapo, bnpo) or completions."""
    if settings["loss_type"] in ("dapo", "bnpo"):
        return xp.sum(as_float(xp, rows.mask))
    return xp.sum(_completions(xp, rows))


def grpo_loss(xp: Any, inputs: LossInputs, settings: Mapping[str, Any]) -> LossTerms:
    """TRL's GRPO family summed over the items of ``grpo_items``, and its metrics."""
    rows = inputs.rows
    width = rows.documents.shape[1]
    mask = as_float(xp, rows.mask)
    tokens = document_sums(xp, mask, rows.segments, width)  # [B, D] completion tokens
    completions = _completions(xp, rows)
    log_ratio = inputs.logps - as_float(xp, rows.values["old_logps"])
    sequence_level = settings["importance_sampling_level"] == "sequence"
    if sequence_level:
        mean_ratio = document_sums(xp, log_ratio * mask, rows.segments, width) / xp.maximum(
            tokens, xp.ones_like(tokens)
        )
        log_weights = to_tokens(xp, mean_ratio, rows.segments, width)
    else:
        log_weights = log_ratio
    ratio = xp.exp(log_weights)
    advantages = to_tokens(xp, as_float(xp, rows.values["advantages"]), rows.segments, width)
    low = 1 - float(settings["epsilon"])
    high = 1 + float(_epsilon_high(settings))
    clipped = xp.clip(ratio, low, high)
    per_token = -xp.minimum(ratio * advantages, clipped * advantages)
    beta = float(settings["beta"])
    metrics: dict[str, tuple[Any, Any]] = {}
    token_count = xp.sum(mask)
    if beta != 0.0:
        reference = as_float(xp, rows.values["ref_logps"])
        kl = (xp.exp(reference - inputs.logps) - (reference - inputs.logps) - 1) * ratio
        per_token = per_token + beta * kl
        metrics["kl"] = (xp.sum(kl * mask), token_count)
    if inputs.entropy is not None:
        metrics["entropy"] = (xp.sum(as_float(xp, inputs.entropy) * mask), token_count)
    total = _aggregate(xp, per_token * mask, rows, tokens, completions, settings)
    is_low = as_float(xp, (ratio < low) & (advantages < 0))
    is_high = as_float(xp, (ratio > high) & (advantages > 0))
    clip_metrics = {
        "clip_ratio/low_mean": is_low,
        "clip_ratio/high_mean": is_high,
        "clip_ratio/region_mean": xp.maximum(is_low, is_high),
    }
    for name, flags in clip_metrics.items():
        if sequence_level:  # one value per completion, as TRL counts them
            per_completion = document_sums(xp, flags * mask, rows.segments, width)
            has_tokens = as_float(xp, tokens > 0)
            value = per_completion / xp.maximum(tokens, xp.ones_like(tokens))
            metrics[name] = (xp.sum(value * has_tokens), xp.sum(completions))
        else:
            metrics[name] = (xp.sum(flags * mask), token_count)
    return LossTerms(total=total, metrics=metrics)


def _aggregate(
    xp: Any, losses: Any, rows: Rows, tokens: Any, completions: Any, settings: Mapping[str, Any]
) -> Any:
    """The masked per-token losses summed as ``loss_type`` weighs them."""
    kind = settings["loss_type"]
    if kind in ("dapo", "bnpo"):
        return xp.sum(losses)
    if kind == "dr_grpo":
        return xp.sum(losses) / float(settings["max_completion_length"])
    width = rows.documents.shape[1]
    per_completion = document_sums(xp, losses, rows.segments, width)
    return xp.sum(per_completion / xp.maximum(tokens, xp.ones_like(tokens)) * completions)


def _epsilon_high(settings: Mapping[str, Any]) -> float:
    high = settings["epsilon_high"]
    return float(settings["epsilon"] if high is None else high)


def _reference_use(settings: Mapping[str, Any]) -> ReferenceUse:
    return ReferenceUse.PER_ROLLOUT if float(settings["beta"]) != 0.0 else ReferenceUse.NONE


#: the generators ``--generator`` names (``recorded:`` takes a file after it)
GENERATORS = ("transformers", "recorded:FILE.jsonl")


def _check(settings: Mapping[str, Any]) -> str | None:
    generator = str(settings["generator"])
    if generator != "transformers" and not (
        generator.startswith("recorded:") and len(generator) > len("recorded:")
    ):
        return f"--generator {generator!r}: use one of {', '.join(GENERATORS)}"
    rewards, weights = settings["reward"], settings["reward_weights"]
    if not rewards:
        return (
            "--objective grpo scores completions with reward functions: pass --reward NAME "
            "(a registered reward, `baton rewards` lists them), --reward rewards.py:fn or "
            "--reward package.module:fn"
        )
    if weights and len(weights) != len(rewards):
        return (
            f"--reward-weights gives {len(weights)} weights for {len(rewards)} rewards; give "
            "one weight per --reward, in the same order"
        )
    return None


GRPO_SETTINGS = (
    Setting(
        "num_generations",
        int,
        8,
        "completions sampled per prompt (the group its advantages are relative to)",
        at_least=2,
    ),
    Setting("max_prompt_length", int, 512, "the longest prompt, in tokens", at_least=1),
    Setting("max_completion_length", int, 512, "the most tokens a completion may have", at_least=1),
    Setting("temperature", float, 1.0, "sampling temperature", above=0),
    Setting("top_p", float, 1.0, "nucleus sampling: the probability mass kept", above=0, at_most=1),
    Setting("top_k", int, 0, "sample among the k most likely tokens (0: all)", at_least=0),
    Setting("epsilon", float, 0.2, "the ratio's lower clipping bound: 1 - epsilon", at_least=0),
    Setting(
        "epsilon_high",
        float,
        None,
        "the ratio's upper clipping bound: 1 + epsilon_high (None: epsilon)",
        at_least=0,
        optional=True,
    ),
    Setting(
        "beta",
        float,
        0.0,
        "the weight of the k3 KL to the reference model (0: no reference)",
        at_least=0,
    ),
    Setting(
        "loss_type",
        str,
        "dapo",
        "how per-token losses are averaged: dapo, grpo, bnpo or dr_grpo",
        choices=GRPO_LOSSES,
    ),
    Setting(
        "importance_sampling_level",
        str,
        "token",
        "the policy ratio per token, or per completion (sequence: GSPO)",
        choices=("token", "sequence"),
    ),
    Setting(
        "num_iterations",
        int,
        1,
        "optimizer steps each batch of rollouts trains (mu)",
        at_least=1,
    ),
    Setting(
        "mask_truncated_completions",
        bool,
        False,
        "leave completions cut at --max-completion-length out of the loss",
    ),
    Setting(
        "scale_rewards",
        str,
        "group",
        "what advantages are divided by: the group's reward std, the batch's, or none",
        choices=("group", "batch", "none"),
    ),
    Setting(
        "generator",
        str,
        "transformers",
        "what samples the completions: transformers (a transformers model holding the "
        "policy's current weights) or recorded:FILE.jsonl (completions replayed from a "
        "rollouts file, e.g. another run's logs/rollouts.jsonl)",
    ),
    Setting(
        "reward",
        str,
        (),
        "a reward function: NAME[:key=value,...], FILE.py:fn or package.module:fn (repeat "
        "for several)",
        repeatable=True,
        not_called=("reward_funcs",),
    ),
    Setting(
        "reward_weights",
        float,
        (),
        "one weight per --reward, in order (default: 1 each)",
        listed=True,
    ),
    REFERENCE,
)

GRPO = Objective(
    name="grpo",
    summary="online RL: TRL's GRPO family over completions sampled each step and scored by "
    "reward functions",
    data=DataKind.PROMPTS,
    loss=grpo_loss,
    items=grpo_items,
    item_name="completion tokens",
    settings=GRPO_SETTINGS,
    reference=_reference_use,
    document_values=("advantages",),
    token_values=("old_logps", "ref_logps"),
    metrics=(*GRPO_LOSS_METRICS, "entropy", "kl"),
    step_metrics=ROLLOUT_METRICS,
    console_keys=("reward", "reward_std", "completions/mean_length"),
    temperature="temperature",
    entropy=True,
    rollouts=True,
    check=_check,
    changeable=frozenset({"reference"}),
)
