"""What a Megatron step minimises (``config.objective``, an ``ObjectiveRun``), read from
the objective's declaration (``baton.core.objectives``): how the model config is set for
it, which forward step the schedule runs, and the one loss function that computes any
declared loss on packed rows.

- Pretraining text (``DataKind.TEXT``): Megatron's windows, ``GPTModel``'s own cross
  entropy, each micro-batch's mean.
- Packed rows, an objective whose loss is the cross entropy of the supervised targets
  (``native_cross_entropy``): Megatron's own per-token cross entropy, summed.
- Packed rows, any other objective: the model's output goes to ``objective_loss``, which
  hands the declared loss what every engine hands it (``LossInputs``): the per-token
  log-probabilities of the targets at the objective's temperature, minus Megatron's
  per-token cross entropy, or, with a temperature other than 1 or the entropy, from the
  vocab-parallel logits (``vocab_parallel.py``: the reductions over the vocabulary run
  over the tensor-parallel group), and the rows' loss mask, documents and values
  (``packed_data.PackedRows``: document values travel in the micro-batch).

On packed rows Megatron's schedule finishes the gradients with its per-token loss
normalisation (``calculate_per_token_loss``, and ``finalize_model_grads_func`` as
Megatron-LM sets it): each micro-batch's loss function returns the sum of the loss over
its items and their count (the supervised tokens, the pairs: the objective's ``items``),
and the gradients are divided by the count of the global batch (every micro-batch and
data-parallel rank), so the step's loss is one mean over the global batch whatever the
micro-batching. The loss function also reports ``[sum, count, metric sums..., metric
weights...]``, which ``step_results`` reduces over the step's micro-batches and ranks in
one collective: the logged loss and each metric, ``sum / weight``.

Example (what ``MegatronBackend.setup`` and ``train_step`` do)::

    check_objective(config)                  # UsageError: what Megatron cannot run
    use_objective(config)                    # before the model and its DDP are built
    forward_step = forward_step_of(config)   # then run_schedule(..., forward_step=...)
    loss, metrics = step_results(config, reduced, device)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from array_api_compat import array_namespace

from baton.backends.megatron.config import MegatronConfig
from baton.backends.megatron.packed_data import VALUES, carried_values
from baton.backends.megatron.posttrain_step import cross_entropy_loss, packed_forward_step
from baton.backends.megatron.step import global_sums, gpt_forward_step, mean_loss
from baton.backends.megatron.vocab_parallel import token_entropy, token_logps
from baton.backends.torch_logps import metric_means, metric_sums
from baton.core.errors import UsageError
from baton.core.objectives import LossInputs, ObjectiveRun, Rows

#: what a loss function reports under this key: ``[sum, count, sums..., weights...]``
REPORTED = "objective"


def check_objective(config: MegatronConfig) -> None:
    """``UsageError`` (one line, the fix) before anything is built, for an objective
    Megatron-Core does not run: one that samples completions each step, a loss of its own
    on pretraining text (packed rows carry the documents a loss reads), values the rows do
    not carry, or packed rows with Transformer Engine's layers."""
    run = config.objective
    declared = run.objective
    if declared.rollouts:
        raise UsageError(
            f"--objective {run.name} samples completions every step: Megatron-Core runs it "
            "from the rollouts' rows, not from prepared data; pick another backend for now"
        )
    if not config.packed_rows and not declared.native_cross_entropy:
        raise UsageError(
            f"--objective {run.name} computes its own loss on {declared.data.described}: "
            "Megatron-Core runs such a loss on packed rows; prepare the data with "
            "`baton data prepare --seq-len N`"
        )
    missing = [
        name
        for name in (*declared.document_values, *declared.token_values)
        if name not in carried_values(run)
    ]
    if missing:
        raise UsageError(
            f"--objective {run.name} reads {', '.join(missing)}, which Megatron-Core's packed "
            "rows do not carry; declare it as a stored reference's value or train elsewhere"
        )
    if config.packed_rows and config.layer_spec == "transformer_engine":
        raise UsageError(
            f"--objective {run.name} runs Megatron's local layers (packed documents as an "
            "attention mask; Transformer Engine's THD path is not built): set layer_spec to "
            "auto or local"
        )


def use_objective(config: MegatronConfig) -> None:
    """Set the model config for ``config.objective`` (before the model and Megatron's DDP
    are built: DDP reads ``calculate_per_token_loss`` when it is constructed)."""
    from megatron.core.distributed import finalize_model_grads

    config.model.finalize_model_grads_func = finalize_model_grads
    config.model.calculate_per_token_loss = config.packed_rows


def uses_objective_loss(config: MegatronConfig) -> bool:
    """Whether the step's loss is the declared one (``objective_loss``), not Megatron's
    own cross entropy."""
    return config.packed_rows and not config.objective.objective.native_cross_entropy


def needs_logits(run: ObjectiveRun) -> bool:
    """Whether the loss needs the logits: a temperature other than 1, or the entropy
    (else Megatron's per-token cross entropy gives the log-probabilities)."""
    return run.temperature != 1.0 or run.objective.entropy


def forward_step_of(config: MegatronConfig) -> Callable[..., Any]:
    """The ``forward_step_func`` of ``config.objective``."""
    run = config.objective
    if not config.packed_rows:
        return gpt_forward_step
    if run.objective.native_cross_entropy:
        return partial(packed_forward_step, cross_entropy_loss)
    return declared_loss_step(run)


def declared_loss_step(run: ObjectiveRun) -> Callable[..., Any]:
    """The ``forward_step_func`` computing ``run``'s declared loss on packed rows
    (``objective_loss``; its results reduced by ``step_results``, or over held-out rows)."""
    logits = needs_logits(run)
    return partial(packed_forward_step, partial(objective_loss, run, logits=logits), logits=logits)


def loss_inputs(
    run: ObjectiveRun, batch: dict[str, torch.Tensor], output: torch.Tensor, *, logits: bool
) -> LossInputs:
    """The objective's inputs from a packed micro-batch and the model's output: Megatron's
    per-token cross entropy (``logits=False``) or its vocab-parallel logits. Log-probabilities
    and entropies are float32 and 0 on padding."""
    if logits:
        logps = token_logps(output, batch["labels"], run.temperature)
        entropy = token_entropy(output, run.temperature) if run.objective.entropy else None
    else:
        logps, entropy = -output.float(), None
    predicted = batch["segments"] > 0
    logps = torch.where(predicted, logps, torch.zeros_like(logps))
    if entropy is not None:
        entropy = torch.where(predicted, entropy, torch.zeros_like(entropy))
    return LossInputs(rows_of(batch), logps, entropy)


def rows_of(batch: dict[str, torch.Tensor]) -> Rows:
    """What the data says about a packed micro-batch (``Rows``): its loss mask, segments,
    documents and the values it carries."""
    values = {key[len(VALUES) :]: value for key, value in batch.items() if key.startswith(VALUES)}
    return Rows(
        mask=batch["loss_mask"] > 0,
        segments=batch["segments"],
        documents=batch["documents"],
        values=values,
    )


def objective_loss(
    run: ObjectiveRun, batch: dict[str, torch.Tensor], output: torch.Tensor, *, logits: bool
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron's three-value loss of the declared objective on one micro-batch: the sum
    of its loss over the micro-batch's items, their count (Megatron adds the counts of the
    global batch and divides the gradients by it), and under ``REPORTED`` the sum, the
    count and each metric's ``(sum, weight)`` (detached), for ``step_results``."""
    inputs = loss_inputs(run, batch, output, logits=logits)
    xp = array_namespace(inputs.logps)
    terms = run.loss(xp, inputs)
    items = run.items(xp, inputs.rows)
    total = terms.total
    sums = metric_sums(terms, run.objective.metrics, like=total)
    pair = torch.stack([total.detach().float(), items.detach().float()])
    count = items.detach().round().to(torch.int)  # a count of items: tokens, pairs, ...
    return total, count, {REPORTED: torch.cat([pair, sums.flatten()])}


def step_results(
    config: MegatronConfig, reduced: list[dict[str, torch.Tensor]], device: torch.device
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The step's loss, a mean over the global batch (micro-batches, pipeline stages and
    data-parallel ranks), and the objective's metrics, each ``sum / weight`` over the
    same (lazy device values)."""
    if not uses_objective_loss(config):
        return mean_loss(reduced, device), {}
    names = config.objective.objective.metrics
    sums = global_sums(reduced, REPORTED, 2 + 2 * len(names), device)
    loss = sums[0] / sums[1].clamp(min=1)
    return loss, metric_means(sums[2:].view(2, len(names)), names)
