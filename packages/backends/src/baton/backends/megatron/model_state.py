"""The ``model_state`` ability on Megatron-Core: this rank's parameters by name, the
reduced gradients before clipping, the optimizer's groups and its schedule, freezing.

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
  schedule at every step. ``set_hyperparameter("lr", x)`` scales the group's schedule
  (its ``max_lr`` and ``min_lr``; the warmup starts at 0) by ``x`` / the schedule's value
  for the next step, so the next step uses ``x`` and the schedule continues from it.
  When the schedule's value is 0 (the first warmup step) nothing can be scaled: ``x``
  is used for the next step only. ``weight_decay`` replaces the group's weight-decay
  schedule by the constant ``x`` (its ``start_wd``, ``end_wd``, ``wd_mult``).
  Both are per-group keys of the optimizer's ``param_groups``, saved in its checkpoint.
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

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from baton.backends.megatron.frozen_grads import FrozenGradients, optimizer_pairs
from baton.backends.megatron.named_params import Entry, named_entries
from baton.backends.megatron.saved_arrays import load_arrays, save_arrays
from baton.backends.torch_distributed import fetch
from baton.core.model_state import Hyperparameter, OptimizerGroup, Piece, matches

Watcher = Callable[[Mapping[str, Any]], None]


class MegatronModelState:
    """``ModelState`` over a set-up ``MegatronBackend``'s chunks, optimizer and scheduler."""

    def __init__(self, chunks: list[Any], optimizer: Any, scheduler: Any, spec: Any) -> None:
        self.chunks, self.optimizer, self.scheduler = chunks, optimizer, scheduler
        self.entries: list[Entry] = named_entries(chunks, spec)
        self.watchers: list[Watcher] = []
        self._frozen: set[str] = set()
        self._frozen_grads: FrozenGradients | None = None
        self._unions: dict[tuple[str, ...], list[str]] = {}
        self._fused_parts: dict[str, list[str]] = {}
        for entry in self.entries:
            if entry.fused is not None:
                self._fused_parts.setdefault(entry.fused, []).append(entry.name)

    # -- parameters -------------------------------------------------------------------
    def parameters(self, patterns: str | Sequence[str] = "*") -> list[Piece]:
        return [
            Piece(
                name=entry.name,
                value=entry.view(entry.param.data),
                global_shape=entry.global_shape,
                index=entry.index,
                counted=entry.counted,
                fused=entry.fused,
                frozen=entry.name in self._frozen,
            )
            for entry in self.entries
            if matches(entry.name, patterns)
        ]

    def assign(self, values: Mapping[str, Any]) -> None:
        by_name = {entry.name: entry for entry in self.entries}
        unknown = sorted(set(values) - set(by_name))
        if unknown:
            raise KeyError(f"no parameters named {unknown[:5]} in this model state")
        with torch.no_grad():
            for name, value in values.items():
                entry = by_name[name]
                entry.view(entry.param.data).copy_(value)

    # -- gradients ----------------------------------------------------------------------
    def watch_gradients(self, watcher: Watcher) -> None:
        self.watchers.append(watcher)

    def show_gradients(self) -> None:
        """Call the watchers with the unfrozen entries' reduced gradients (the backend
        calls this after ``finalize_model_grads``, before ``optimizer.step()``)."""
        if not self.watchers:
            return
        if self._distributed_optimizer():
            self._gather_grad_buffers()
        grads = {
            entry.name: entry.view(entry.param.main_grad)
            for entry in self.entries
            if entry.name not in self._frozen
        }
        for watcher in self.watchers:
            watcher(grads)

    def _distributed_optimizer(self) -> bool:
        return any(chunk.ddp_config.use_distributed_optimizer for chunk in self.chunks)

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

    # -- reductions -----------------------------------------------------------------------
    def sum_over_ranks(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """One all-reduce of the values stacked in the order of the names' union over
        ranks (gathered the first time a rank passes this set of names, then cached)."""
        local = tuple(sorted(values))
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
            return dict(values)
        union = self._unions.get(local)
        if union is None:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, local)
            union = sorted({name for names in gathered for name in names})
            self._unions[local] = union
        device = next(iter(self.chunks[0].parameters())).device
        zero = torch.zeros((), device=device)
        stacked = torch.stack(
            [torch.as_tensor(values.get(name, zero), device=device).float() for name in union]
        )
        dist.all_reduce(stacked)
        return dict(zip(union, stacked.unbind(0), strict=True))

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        return fetch(values)

    # -- optimizer ------------------------------------------------------------------------
    def optimizer_groups(self) -> list[OptimizerGroup]:
        names_of: dict[int, list[str]] = {}
        for entry in self.entries:
            names_of.setdefault(id(entry.param), []).append(entry.name)
        model_of = {id(main): model for model, main in optimizer_pairs(self.optimizer)}
        groups = []
        for number, group in enumerate(self.optimizer.param_groups):
            names = [
                name
                for main in group["params"]
                for name in names_of.get(id(model_of.get(id(main), main)), [])
            ]
            groups.append(
                OptimizerGroup(
                    index=number,
                    lr=float(group["lr"]),
                    weight_decay=float(group["weight_decay"]),
                    names=tuple(names),
                )
            )
        return groups

    def set_hyperparameter(
        self, name: Hyperparameter, value: float, *, groups: Sequence[int] | None = None
    ) -> None:
        param_groups = self.optimizer.param_groups
        chosen = range(len(param_groups)) if groups is None else groups
        for number in chosen:
            group = param_groups[number]
            if name == "lr":
                self._scale_schedule(group, value)
            elif name == "weight_decay":
                group["start_wd"] = group["end_wd"] = value
                group["wd_mult"] = 1.0
                group["weight_decay"] = value
            else:
                raise ValueError(f"unknown hyperparameter {name!r}: use 'lr' or 'weight_decay'")

    def _scale_schedule(self, group: dict[str, Any], value: float) -> None:
        scheduler = self.scheduler
        current = scheduler.get_lr(group)
        if current > 0:
            factor = value / current
            group["max_lr"] = group.get("max_lr", scheduler.max_lr) * factor
            group["min_lr"] = group.get("min_lr", scheduler.min_lr) * factor
        group["lr"] = value

    # -- freezing -------------------------------------------------------------------------
    def freeze(self, patterns: str | Sequence[str]) -> list[str]:
        names = self._matching(patterns)
        if self._frozen_grads is None:
            self._frozen_grads = FrozenGradients(self.optimizer)
        self._frozen.update(names)
        self._sync_frozen()
        return names

    def unfreeze(self, patterns: str | Sequence[str]) -> list[str]:
        names = self._matching(patterns)
        self._frozen.difference_update(names)
        self._sync_frozen()
        return names

    def _matching(self, patterns: str | Sequence[str]) -> list[str]:
        names = [entry.name for entry in self.entries if matches(entry.name, patterns)]
        chosen = set(names)
        for fused, parts in self._fused_parts.items():
            if chosen & set(parts) and not set(parts) <= chosen:
                raise ValueError(
                    f"{sorted(chosen & set(parts))} are part of Megatron's fused {fused}, "
                    f"whose parts {parts} are trained together: match all of them"
                )
        return sorted(chosen)

    def _sync_frozen(self) -> None:
        if self._frozen_grads is not None:
            self._frozen_grads.frozen = {
                id(entry.param) for entry in self.entries if entry.name in self._frozen
            }

    # -- arrays beside a checkpoint ---------------------------------------------------------
    def save_arrays(self, directory: Path, arrays: Mapping[str, Any]) -> None:
        save_arrays(directory, arrays, self.parameters())

    def load_arrays(self, directory: Path) -> dict[str, Any]:
        return load_arrays(directory, self.parameters())
