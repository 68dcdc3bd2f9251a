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
- Rollouts (an objective that samples completions each step: GRPO): the same loss
  function on the step's rollouts, one a row (``rollout_rows.RolloutStream``: their
  sampling and reference log-probabilities per token, their advantages per rollout).

On packed rows Megatron's schedule finishes the gradients with its per-token loss
normalisation (``calculate_per_token_loss``, and ``finalize_model_grads_func`` as
Megatron-LM sets it): each micro-batch's loss function returns the sum of the loss over
its items and their count (the supervised tokens, the pairs: the objective's ``items``),
and the gradients are divided by the count of the global batch (every micro-batch and
data-parallel rank), so the step's loss is one mean over the global batch whatever the
micro-batching. The loss function also reports ``[sum, count, metric sums..., metric
weights...]``, which ``step_results`` reduces over the step's micro-batches and ranks in
one collective: the logged loss and each metric, ``sum / weight`` (the metrics the loss
returns: ``LossMetrics``).

Example (what ``MegatronBackend.setup`` and ``train_step`` do)::

    check_objective(config)                  # UsageError: what Megatron cannot run
    use_objective(config)                    # before the model and its DDP are built
    metrics = LossMetrics(config.objective.objective.metrics)
    forward_step = forward_step_of(config, metrics)   # run_schedule(..., forward_step=...)
    loss, logged = step_results(config, reduced, device, metrics)
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
from baton.core.objectives import LossInputs, LossTerms, ObjectiveRun, Rows

#: what a loss function reports under this key: ``[sum, count, sums..., weights...]``
REPORTED = "objective"


def check_objective(config: MegatronConfig) -> None:
    """``UsageError`` (one line, the fix) before anything is built, for an objective
    Megatron-Core does not run: a loss of its own on pretraining text (packed rows carry
    the documents a loss reads), values the rows do not carry (packed rows a stored
    reference's, rollouts' rows their log-probabilities and advantages), or rows with
    Transformer Engine's layers."""
    run = config.objective
    declared = run.objective
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
        rows = "rollouts' rows" if declared.rollouts else "packed rows"
        raise UsageError(
            f"--objective {run.name} reads {', '.join(missing)}, which Megatron-Core's {rows} "
            "do not carry; declare it as a stored reference's value or train elsewhere"
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


class LossMetrics:
    """The metrics a run's loss returns: those of its objective's declared ``metrics``
    that the loss's ``LossTerms.metrics`` hold (GRPO's ``kl`` only with a KL term), seen
    at its first micro-batch. Every declared metric travels in the reported sums (one
    shape on every rank); only the returned ones are logged."""

    def __init__(self, declared: tuple[str, ...]) -> None:
        self.declared = declared
        #: the returned names, once a loss ran here or the last pipeline stage told them
        self.returned: tuple[str, ...] | None = None
        self._agreed = False

    def saw(self, terms: LossTerms) -> None:
        """Note the names of a micro-batch's loss terms (the first call decides)."""
        if self.returned is None:
            self.returned = tuple(name for name in self.declared if name in terms.metrics)

    def names(self) -> tuple[str, ...]:
        """The returned names on every rank: a pipeline's other stages, which run no loss,
        are told once by the last stage (one collective over the pipeline group, at the
        first step)."""
        if not self._agreed:
            self.returned, self._agreed = _from_last_stage(self.returned), True
        assert self.returned is not None
        return self.returned


def _pipeline_stages() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_pipeline_model_parallel_world_size()


def _from_last_stage(names: tuple[str, ...] | None) -> tuple[str, ...]:
    """The last pipeline stage's ``names`` on every stage of this rank's pipeline."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    box: list[Any] = [names]
    if _pipeline_stages() > 1:
        dist.broadcast_object_list(
            box,
            src=parallel_state.get_pipeline_model_parallel_last_rank(),
            group=parallel_state.get_pipeline_model_parallel_group(),
        )
    if box[0] is None:
        raise RuntimeError("the objective's loss never ran on the last pipeline stage")
    return tuple(box[0])


def forward_step_of(
    config: MegatronConfig, metrics: LossMetrics | None = None
) -> Callable[..., Any]:
    """The ``forward_step_func`` of ``config.objective`` (``metrics`` notes the names the
    declared loss returns)."""
    run = config.objective
    if not config.packed_rows:
        return gpt_forward_step
    if run.objective.native_cross_entropy:
        return partial(packed_forward_step, cross_entropy_loss)
    return declared_loss_step(run, metrics)


def declared_loss_step(run: ObjectiveRun, metrics: LossMetrics | None = None) -> Callable[..., Any]:
    """The ``forward_step_func`` computing ``run``'s declared loss on packed rows
    (``objective_loss``; its results reduced by ``step_results``, or over held-out rows;
    ``metrics`` notes the names the loss returns)."""
    logits = needs_logits(run)
    loss = partial(objective_loss, run, logits=logits, metrics=metrics)
    return partial(packed_forward_step, loss, logits=logits)


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
    run: ObjectiveRun,
    batch: dict[str, torch.Tensor],
    output: torch.Tensor,
    *,
    logits: bool,
    metrics: LossMetrics | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron's three-value loss of the declared objective on one micro-batch: the sum
    of its loss over the micro-batch's items, their count (Megatron adds the counts of the
    global batch and divides the gradients by it), and under ``REPORTED`` the sum, the
    count and each declared metric's ``(sum, weight)`` (detached), for ``step_results``."""
    inputs = loss_inputs(run, batch, output, logits=logits)
    xp = array_namespace(inputs.logps)
    terms = run.loss(xp, inputs)
    if metrics is not None:
        metrics.saw(terms)
    items = run.items(xp, inputs.rows)
    total = terms.total
    sums = metric_sums(terms, run.objective.metrics, like=total)
    pair = torch.stack([total.detach().float(), items.detach().float()])
    count = items.detach().round().to(torch.int)  # a count of items: tokens, pairs, ...
    return total, count, {REPORTED: torch.cat([pair, sums.flatten()])}


def step_results(
    config: MegatronConfig,
    reduced: list[dict[str, torch.Tensor]],
    device: torch.device,
    metrics: LossMetrics | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The step's loss, a mean over the global batch (micro-batches, pipeline stages and
    data-parallel ranks), and the objective's metrics, each ``sum / weight`` over the
    same (lazy device values): those ``metrics`` says the loss returns, else every
    declared one."""
    if not uses_objective_loss(config):
        return mean_loss(reduced, device), {}
    names = config.objective.objective.metrics
    sums = global_sums(reduced, REPORTED, 2 + 2 * len(names), device)
    loss = sums[0] / sums[1].clamp(min=1)
    means = metric_means(sums[2:].view(2, len(names)), names)
    if metrics is not None:
        returned = metrics.names()
        means = {name: value for name, value in means.items() if name in returned}
    return loss, means
