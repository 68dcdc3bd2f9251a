"""DPO inside MaxText's own ``train_step``: a loss function over precomputed reference
log-probabilities, put in place by a patch that undoes itself on teardown.

MaxText 0.2.5 trains DPO only through its Tunix trainer (``train_dpo.py``), which keeps a
live reference model and computes its log-probabilities at every step; the pretraining
``train_step`` refuses ``use_dpo``. baton computes the reference's log-probabilities once
before training (``reference``) and runs MaxText's ``train_step`` unchanged: the patch
:class:`MaxTextDpoLoss` (a run with ``objective="dpo"`` only) replaces two module
functions of ``maxtext.trainers.pre_train.train`` that ``train_step`` looks up when it is
traced, the least it can change:

- ``loss_fn``: MaxText's model on the batch (inputs, positions, segments, as MaxText's
  own loss calls it), then the DPO loss of :mod:`baton.backends.maxtext.dpo` against the
  batch's ``reference_logps``. It keeps MaxText's normalisation contract: the mean over
  the micro-batch's pairs, or their sum under MaxText's gradient accumulation (which
  divides the accumulated sum by the summed ``total_weights``, here the pairs), so the
  step's loss is the mean over the pairs of the global batch;
- ``record_activation_metrics``, the hook ``train_step`` calls with the step's
  intermediates when ``record_internal_nn_metrics`` is on (the patch sets it; the
  activation statistics some MaxText layers then keep are logged only where the run
  asked for them): it adds TRL's metrics from the sums the loss left there (summed over
  micro-batches by MaxText's accumulation, over ranks by the jitted step).

Gradient clipping, the optimizer, sharding and gradient accumulation stay MaxText's.

Example::

    baton run recipes/maxtext_tiny.py --objective dpo --data-path data/pairs \\
        --tokenizer runs/tok --init-from sft-model/ --dpo-beta 0.1 --dpo-loss sigmoid
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from baton.backends.maxtext.dpo import document_logps, pair_metrics, pair_sums, target_logps
from baton.core.patches import Patch, PatchRecorder, register_patch

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView

#: where the loss leaves its sums among the step's intermediates
SUMS_KEY = "baton_dpo"


def model_logits(model: Any, config: Any, data: dict[str, Any], is_train: bool) -> Any:
    """MaxText's model on a batch, as MaxText's own ``loss_fn`` calls it (text only)."""
    return model(
        decoder_input_tokens=data["inputs"],
        decoder_positions=data["inputs_position"],
        decoder_segment_ids=data["inputs_segmentation"],
        enable_dropout=config.enable_dropout if is_train else False,
        decoder_target_tokens=data["targets"],
        decoder_target_mask=data["targets_segmentation"],
    )


def dpo_loss_fn(beta: float, loss_type: str) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """A replacement for MaxText's ``train.loss_fn`` (same signature and aux keys)."""
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
        reference = data["reference_logps"]
        token = target_logps(logits, data["targets"])
        logps, counts = document_logps(token, data["targets_segmentation"], reference.shape[1])
        sums = pair_sums(logps, counts, reference, beta=beta, loss_type=loss_type)
        accumulates = config.gradient_accumulation_steps > 1 and not getattr(
            config, "use_tunix_gradient_accumulation", False
        )
        loss = sums["loss"] if accumulates else sums["loss"] / (sums["pairs"] + EPS)
        intermediates[SUMS_KEY] = {"metrics": sums["metrics"], "pairs": sums["pairs"]}
        zero = jnp.zeros((), jnp.float32)
        return loss, {
            "intermediate_outputs": intermediates,
            "xent_sum": sums["loss"],
            "z_loss": zero,
            "total_weights": sums["pairs"],
            "moe_lb_loss": zero,
            "indexer_loss": zero,
            "moe_bias_updates": None,
            "mtp_moe_bias_updates": None,
            "mtp_loss": zero,
            "batch_stats": None,
            "has_moe_overflow": jnp.bool_(False),
        }

    return loss_fn


def recording_dpo_metrics(record: Callable[..., None], activations: bool) -> Callable[..., None]:
    """TRL's DPO metrics from the loss's sums; MaxText's ``record_activation_metrics``
    too where the run asked for them (``activations``)."""

    @functools.wraps(record)
    def record_with_dpo(output_metrics: Any, intermediate_outputs: Any, config: Any) -> None:
        if activations:
            record(output_metrics, intermediate_outputs, config)
        sums = intermediate_outputs.get(SUMS_KEY) if hasattr(intermediate_outputs, "get") else None
        if sums is not None:
            output_metrics["scalar"].update(pair_metrics(sums["metrics"], sums["pairs"]))

    return record_with_dpo


@register_patch
class MaxTextDpoLoss(Patch):
    """Train DPO in MaxText's own ``train_step``: its loss over precomputed reference
    log-probabilities, and TRL's metrics among the step's scalars."""

    name = "maxtext_dpo_loss"
    backend = "maxtext"
    versions = ">=0.2.5,<0.3"
    phase = "configure"

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        objective = getattr(backend.config, "objective", "pretrain")
        if objective != "dpo":
            return False, f"objective={objective}"
        return True, "objective=dpo"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        from maxtext.trainers.pre_train import train

        config: Any = driver.backend.config
        loss = dpo_loss_fn(float(config.dpo_beta), str(config.dpo_loss))
        recorder.setattr(train, "loss_fn", loss)
        asked = bool(config.overrides.get("record_internal_nn_metrics", False))
        recording = recording_dpo_metrics(train.record_activation_metrics, asked)
        recorder.setattr(train, "record_activation_metrics", recording)
        recorder.setitem(config.overrides, "record_internal_nn_metrics", True)
