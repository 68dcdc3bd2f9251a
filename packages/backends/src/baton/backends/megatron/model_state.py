"""The ``model_state`` ability on Megatron-Core: the shared torch ``TorchModelState``
(``baton.backends.torch_model_state``: pieces, assign, sums over ranks, arrays beside a
checkpoint) with Megatron's gradients, freezing and learning-rate schedule.

- Names and layout: ``named_params`` (Hugging Face names for a model built from the
  shared spec, ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` as views into
  ``linear_qkv`` / ``linear_fc1``; tensor-parallel shards, pipeline stages by global layer
  number, one counted holder among data-parallel replicas).
- Gradients: after ``finalize_model_grads`` (data-parallel reduction, tied-embedding and
  sequence-parallel norm reductions) and before ``optimizer.step()`` (its clipping), the
  watchers get the ``main_grad`` views (fp32 grad buffers) of the unfrozen entries. With
  the distributed optimizer each rank holds only its shard of the reduced buffer: while a
  watcher is installed, the buffers are all-gathered over the data-parallel group first
  (one all-gather per bucket per step; none without a watcher).
- Learning rate: Megatron's ``OptimizerParamScheduler`` sets each group's ``lr`` from its
  schedule at every step. ``set_hyperparameter("lr", x)`` sets the group's
  ``baton_lr_scale`` (``scheduler.BatonParamScheduler``) to ``x`` / the schedule's value
  for the next step: the next step uses ``x`` and the schedule continues from it, scaled.
  When the schedule's value is 0 (the first warmup step) nothing can be scaled: ``x``
  is used for the next step only. ``weight_decay`` replaces the group's scheduled weight
  decay by the constant ``x`` (``baton_weight_decay``). Both keys live in the optimizer's
  ``param_groups``, saved and restored with its checkpoint (Megatron's own schedule keys
  identify a group on load, so they are left as built).
- Freezing: ``frozen_grads.FrozenGradients`` drops the frozen parameters' gradients in
  the optimizer, after it prepared them and before it clips: weights, fp32 main copies
  and Adam state stay bit-identical. Part of a fused tensor alone is refused.
- ``assign`` writes the model's weights (what the forward pass reads); in bf16/fp16 the
  optimizer's fp32 main copies are left as they are (assign the old values back before
  training on, as EMA evaluation does).

Example::

    state = backend.model_state()
    state.freeze(["model.embed_tokens.weight", "model.layers.0.*"])
    state.set_hyperparameter("lr", 1e-4)
    state.watch_gradients(lambda grads: print(sorted(grads)))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from baton.backends.megatron.frozen_grads import FrozenGradients, optimizer_pairs
from baton.backends.megatron.named_params import named_entries
from baton.backends.megatron.scheduler import LR_SCALE, WEIGHT_DECAY, set_lr
from baton.backends.torch_model_state import Fetch, TorchModelState
from baton.core.model_state import Hyperparameter, OptimizerGroup


class MegatronModelState(TorchModelState):
    """``ModelState`` over a set-up ``MegatronBackend``'s chunks, optimizer and scheduler."""

    def __init__(
        self, chunks: list[Any], optimizer: Any, scheduler: Any, *, spec: Any, fetch: Fetch
    ) -> None:
        super().__init__(named_entries(chunks, spec), optimizers=[optimizer], fetch=fetch)
        self.chunks, self.optimizer, self.scheduler = chunks, optimizer, scheduler
        self._frozen_grads: FrozenGradients | None = None

    # -- gradients ----------------------------------------------------------------------
    def before_clipping(self) -> None:
        """Show the unfrozen entries' reduced gradients (``main_grad``) to the watchers.
        The backend calls it after ``finalize_model_grads``, before ``optimizer.step()``;
        frozen gradients are dropped inside the optimizer (``FrozenGradients``)."""
        if not self._watchers:
            return
        if any(chunk.ddp_config.use_distributed_optimizer for chunk in self.chunks):
            self._gather_grad_buffers()
        grads = {
            entry.name: entry.view(entry.parameter.main_grad)
            for entry in self.entries
            if entry.name not in self._frozen
        }
        for watcher in self._watchers:
            watcher(grads)

    def _gather_grad_buffers(self) -> None:
        """Every data-parallel rank's reduced shard of each grad bucket, into the whole
        bucket on every rank (what the distributed optimizer's reduce-scatter left)."""
        from megatron.core.distributed.param_and_grad_buffer import shard_buffer

        for chunk in self.chunks:
            for group in [*chunk.bucket_groups, *chunk.expert_parallel_bucket_groups]:
                ranks = group.intra_distributed_optimizer_instance_group
                size = dist.get_world_size(ranks)
                if size == 1:
                    continue
                rank = dist.get_rank(ranks)
                for bucket in group.buckets:
                    shard = shard_buffer(bucket.grad_data, size)[rank]
                    dist.all_gather_into_tensor(bucket.grad_data, shard.clone(), group=ranks)

    # -- freezing -------------------------------------------------------------------------
    def _refresh_frozen(self) -> None:
        super()._refresh_frozen()
        if self._frozen_grads is None and self._frozen_parameters:
            self._frozen_grads = FrozenGradients(self.optimizer)
        if self._frozen_grads is not None:
            self._frozen_grads.frozen = {id(param) for param in self._frozen_parameters}

    # -- optimizer ------------------------------------------------------------------------
    def optimizer_groups(self) -> list[OptimizerGroup]:
        """Megatron's parameter groups (its optimizer's ``param_groups``, chained ones in
        order), named by the model parameters their main copies belong to."""
        names_of: dict[int, list[str]] = {}
        for entry in self.entries:
            names_of.setdefault(id(entry.parameter), []).append(entry.name)
        model_of = {id(main): model for model, main in optimizer_pairs(self.optimizer)}
        groups = []
        for number, group in enumerate(self.optimizer.param_groups):
            models = [model_of.get(id(main), main) for main in group["params"]]
            groups.append(
                OptimizerGroup(
                    index=number,
                    lr=float(group["lr"]),
                    weight_decay=float(group["weight_decay"]),
                    names=tuple(name for model in models for name in names_of.get(id(model), [])),
                )
            )
        return groups

    def _set_lr(self, optimizer: Any, group: dict[str, Any], value: float) -> None:
        """Scale the group's schedule (``scheduler.LR_SCALE``) so the next step uses
        ``value`` and the schedule continues from it."""
        del optimizer
        scheduled = self.scheduler.get_lr(group)
        if scheduled > 0:
            group[LR_SCALE] = value / scheduled
        set_lr(group, value)

    def set_hyperparameter(
        self, name: Hyperparameter, value: float, *, groups: Sequence[int] | None = None
    ) -> None:
        """``lr``: the schedule scaled to continue from ``value``; ``weight_decay``: the
        groups' scheduled weight decay replaced by ``value`` (``scheduler.py``)."""
        super().set_hyperparameter(name, value, groups=groups)
        if name == "weight_decay":
            param_groups = self.optimizer.param_groups
            for number in range(len(param_groups)) if groups is None else groups:
                param_groups[number][WEIGHT_DECAY] = float(value)
