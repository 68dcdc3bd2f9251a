"""An objective's loss inside MaxText's own jitted ``train_step``, for every objective
that does not run MaxText's fused cross entropy (``Objective.native_cross_entropy``):
one loss function, read from the declaration alone, put in place by a patch that undoes
itself on teardown.

MaxText's pretraining ``train_step`` computes only its own cross entropy. The patch
:class:`MaxTextObjectiveLoss` replaces two module functions of
``maxtext.trainers.pre_train.train`` that ``train_step`` looks up when it is traced, the
least it can change:

- ``loss_fn``: MaxText's model on the batch (inputs, positions, segments, as MaxText's
  own loss calls it); the log-probabilities of the targets under the logits divided by
  the objective's temperature (float32) and, where the objective reads it, the entropy
  of each predicted distribution (no gradient); the batch's ``Rows`` (the loss mask
  ``targets_segmentation != 0``, the documents ``inputs_segmentation``, the rows'
  ``documents`` and the objective's document and token values, carried in the batch
  dict by ``packed_batches``); then ``run.loss(xp, inputs)``, the loss written once
  against the array API (``xp``: ``jax.numpy``, through ``array_api_compat``). It keeps
  MaxText's normalisation contract: ``total_weights`` is ``run.items`` (what the loss is
  a mean over), the loss the mean over the micro-batch's items, or their sum under
  MaxText's gradient accumulation (which divides the accumulated sum by the summed
  ``total_weights``), so the step's loss is one mean over the global batch whatever the
  layout. Each metric's ``(sum, weight)`` is left among the intermediates, which MaxText's
  accumulation sums over micro-batches like the loss;
- ``record_activation_metrics``, the hook ``train_step`` calls with the step's
  intermediates when ``record_internal_nn_metrics`` is on (the patch sets it for an
  objective with metrics; the activation statistics some MaxText layers then keep are
  logged only where the run asked for them): each metric becomes ``sum / weight`` among
  the step's scalars, a device value read on log steps only.

The sums are over the global batch already: the jitted step computes on the global
arrays, so its data-parallel (and vocabulary-sharded) reductions are the compiler's.
Gradient clipping, the optimizer, sharding and gradient accumulation stay MaxText's.

Example::

    baton run recipes/maxtext_tiny.py --objective dpo --data-path data/pairs \\
        --tokenizer runs/tok --init-from sft-model/ --dpo-beta 0.1 --dpo-loss sigmoid

    logps, entropy = token_logps(logits, batch["targets"], run.temperature, entropy=True)
    rows = batch_rows(run, batch)                  # Rows from MaxText's batch arrays
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from baton.backends.maxtext.packed_batches import DOCUMENTS_KEY
from baton.core.objectives import LossInputs, ObjectiveRun, Rows
from baton.core.patches import Patch, PatchRecorder, register_patch

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView

#: where the loss leaves its metrics' ``(sum, weight)`` among the step's intermediates
METRICS_KEY = "baton_objective_metrics"


def model_logits(model: Any, config: Any, data: Mapping[str, Any], is_train: bool) -> Any:
    """MaxText's model on a batch, as MaxText's own ``loss_fn`` calls it (text only)."""
    return model(
        decoder_input_tokens=data["inputs"],
        decoder_positions=data["inputs_position"],
        decoder_segment_ids=data["inputs_segmentation"],
        enable_dropout=config.enable_dropout if is_train else False,
        decoder_target_tokens=data["targets"],
        decoder_target_mask=data["targets_segmentation"],
    )


def token_logps(
    logits: Any, targets: Any, temperature: float = 1.0, *, entropy: bool = False
) -> tuple[Any, Any | None]:
    """``log p(targets[b, t])`` under ``logits[b, t] / temperature`` (float32, shaped like
    ``targets``) and, with ``entropy``, the entropy of each predicted distribution at the
    same temperature, without gradient (else ``None``)."""
    import jax
    import jax.numpy as jnp

    scaled = logits.astype(jnp.float32)
    if temperature != 1.0:
        scaled = scaled / temperature
    logprobs = jax.nn.log_softmax(scaled, axis=-1)
    picked = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    if not entropy:
        return picked, None
    spread = -jnp.sum(jnp.exp(logprobs) * logprobs, axis=-1)
    return picked, jax.lax.stop_gradient(spread)


def batch_rows(run: ObjectiveRun, data: Mapping[str, Any]) -> Rows:
    """What MaxText's batch arrays say about its rows (``Rows``): the loss mask, each
    target's document, the rows' documents and the objective's values the batch carries
    (a token value the run does not use, GRPO's ``ref_logps`` at beta 0, is absent)."""
    declared = (*run.objective.document_values, *run.objective.token_values)
    return Rows(
        mask=data["targets_segmentation"] != 0,
        segments=data["inputs_segmentation"],
        documents=data[DOCUMENTS_KEY],
        values={name: data[name] for name in declared if name in data},
    )


def objective_loss_fn(run: ObjectiveRun) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """A replacement for MaxText's ``train.loss_fn`` (same signature and aux keys)
    computing ``run``'s loss."""
    import array_api_compat
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from maxtext.utils.globals import EPS

    def loss_fn(
        model: Any,
        config: Any,
        data: dict[str, Any],
        dropout_rng: Any,
        params: Any,
        sparsity_state: Any = None,
        is_train: bool = True,
    ) -> tuple[Any, dict[str, Any]]:
        del dropout_rng, params, sparsity_state
        size = (
            config.micro_batch_size_to_train_on if is_train else config.micro_batch_size_to_eval_on
        )
        data = {key: value[:size] for key, value in data.items()}
        logits = model_logits(model, config, data, is_train)
        intermediates = nnx.pop(model, nnx.Intermediate).to_pure_dict()
        rows = batch_rows(run, data)
        logps, entropy = token_logps(
            logits, data["targets"], run.temperature, entropy=run.objective.entropy
        )
        logps = jnp.where(rows.segments != 0, logps, 0.0)  # nothing predicted on padding
        xp = array_api_compat.array_namespace(logps)
        terms = run.loss(xp, LossInputs(rows, logps, entropy))
        items = run.items(xp, rows)
        accumulates = config.gradient_accumulation_steps > 1 and not getattr(
            config, "use_tunix_gradient_accumulation", False
        )
        loss = terms.total if accumulates else terms.total / (items + EPS)
        intermediates[METRICS_KEY] = {
            name: jax.lax.stop_gradient(jnp.stack([total, weight]).astype(jnp.float32))
            for name, (total, weight) in terms.metrics.items()
        }
        zero = jnp.zeros((), jnp.float32)
        return loss, {
            "intermediate_outputs": intermediates,
            "xent_sum": terms.total,
            "z_loss": zero,
            "total_weights": items,
            "moe_lb_loss": zero,
            "indexer_loss": zero,
            "moe_bias_updates": None,
            "mtp_moe_bias_updates": None,
            "mtp_loss": zero,
            "batch_stats": None,
            "has_moe_overflow": jnp.bool_(False),
        }

    return loss_fn


def metric_means(sums: Mapping[str, Any]) -> dict[str, Any]:
    """Each metric's ``sum / weight`` from its stacked ``(sum, weight)`` (0 where no item
    weighs)."""
    import jax.numpy as jnp

    return {name: pair[0] / jnp.maximum(pair[1], 1e-12) for name, pair in sums.items()}


def recording_objective_metrics(
    record: Callable[..., None], activations: bool
) -> Callable[..., None]:
    """The objective's metrics from the sums the loss left; MaxText's
    ``record_activation_metrics`` too where the run asked for them (``activations``)."""

    @functools.wraps(record)
    def record_with_objective(output_metrics: Any, intermediate_outputs: Any, config: Any) -> None:
        if activations:
            record(output_metrics, intermediate_outputs, config)
        found = hasattr(intermediate_outputs, "get")
        sums = intermediate_outputs.get(METRICS_KEY) if found else None
        if sums:
            output_metrics["scalar"].update(metric_means(sums))

    return record_with_objective


@register_patch
class MaxTextObjectiveLoss(Patch):
    """Train an objective that is not MaxText's cross entropy in MaxText's own
    ``train_step``: its loss from its declaration, and its metrics among the step's
    scalars."""

    name = "maxtext_objective_loss"
    backend = "maxtext"
    versions = ">=0.2.5,<0.3"
    phase = "configure"

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        run = getattr(backend.config, "objective", None)
        if not isinstance(run, ObjectiveRun):
            return False, "no objective"
        if run.objective.native_cross_entropy:
            return False, f"objective={run.name}: MaxText's own cross entropy"
        return True, f"objective={run.name}"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        from maxtext.trainers.pre_train import train

        config: Any = driver.backend.config
        run: ObjectiveRun = config.objective
        recorder.setattr(train, "loss_fn", objective_loss_fn(run))
        if not run.objective.metrics:
            return
        asked = bool(config.overrides.get("record_internal_nn_metrics", False))
        recording = recording_objective_metrics(train.record_activation_metrics, asked)
        recorder.setattr(train, "record_activation_metrics", recording)
        recorder.setitem(config.overrides, "record_internal_nn_metrics", True)
