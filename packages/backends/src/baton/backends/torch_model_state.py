"""The ``model_state`` ability for every torch backend: one ``TorchModelState``.

A backend builds it once after setup from its entries (``baton.backends.torch_pieces``:
each shown name, its parameter, its layout), its optimizers and learning-rate
schedulers, and calls ``before_clipping()`` at one point of its step: after backward
(and the gradient reduction) and before clipping and the optimizer step::

    state = TorchModelState(
        entries_from_parameters(model.named_parameters()),
        optimizers=[optimizer],
        schedulers=[scheduler],
        fetch=backend.fetch,
    )
    ...                                   # in the step
    loss.backward()
    state.before_clipping()               # frozen gradients dropped, watchers called
    clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()

What each operation does on torch:

- ``parameters()``: views of the local tensors (a DTensor's local shard); writing into
  them changes the model.
- ``watch_gradients``: at ``before_clipping`` every watcher gets ``{name: gradient}``
  of the parameters that have one and are not frozen, laid out like the pieces. With
  no watcher and nothing frozen ``before_clipping`` does nothing.
- ``freeze``: at ``before_clipping`` the frozen parameters' gradients are dropped
  (``grad = None``), so clipping, weight decay and the optimizer (its moments and step
  counts included) skip them: the weights stay bitwise unchanged.
- ``set_hyperparameter("lr", x)``: the group's ``lr`` becomes ``x`` for the next step,
  and its scheduler's ``base_lrs`` (and the group's ``initial_lr``) are scaled by
  ``x / lr``, so a ``LambdaLR`` (TorchTitan, warmup/cosine recipes) and the chainable
  schedulers continue from ``x`` with the same shape. A group whose current rate is 0
  (the first warmup step) takes ``x`` as its new base. ``weight_decay`` is set as is.
- ``sum_over_ranks``: one all-reduce of the stacked scalars over ``group`` (the whole
  world by default). The names are unioned over the ranks on the first call with a
  given set of names (one small gather), then cached: ranks must pass the same names
  at every call (a callback does).
- ``save_arrays`` / ``load_arrays``: ``baton.backends.torch_arrays``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from baton.backends import torch_arrays
from baton.backends.torch_pieces import Entry, local_gradient
from baton.core.model_state import Hyperparameter, OptimizerGroup, Piece, matches

Watcher = Callable[[Mapping[str, Any]], None]
Fetch = Callable[[Mapping[str, Any]], dict[str, float]]


class TorchModelState:
    """``ModelState`` over torch parameters, optimizers and LR schedulers (see module)."""

    def __init__(
        self,
        entries: Sequence[Entry],
        *,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        schedulers: Sequence[Any] = (),
        fetch: Fetch,
        group: Any = None,
    ) -> None:
        names = [entry.name for entry in entries]
        if len(set(names)) != len(names):
            repeated = sorted({name for name in names if names.count(name) > 1})
            raise ValueError(f"model_state: names shown twice: {repeated}")
        self.entries = list(entries)
        self.optimizers = list(optimizers)
        self.schedulers = list(schedulers)
        self._fetch = fetch
        self.group = group
        self._watchers: list[Watcher] = []
        self._frozen: set[str] = set()
        self._frozen_parameters: list[torch.nn.Parameter] = []
        self._union_cache: dict[frozenset[str], list[str]] = {}

    # -- parameters -------------------------------------------------------------------

    def parameters(self, patterns: str | Sequence[str] = "*") -> list[Piece]:
        """The pieces whose names match (views of the local tensors)."""
        return [self._piece(entry) for entry in self.entries if matches(entry.name, patterns)]

    def _piece(self, entry: Entry) -> Piece:
        return Piece(
            name=entry.name,
            value=entry.local(entry.parameter),
            global_shape=entry.global_shape,
            index=entry.index,
            counted=entry.counted,
            fused=entry.fused,
            frozen=entry.name in self._frozen,
        )

    def assign(self, values: Mapping[str, Any]) -> None:
        """Copy each array into its named piece (shapes must match the piece's)."""
        by_name = {entry.name: entry for entry in self.entries}
        unknown = sorted(set(values) - set(by_name))
        if unknown:
            raise KeyError(f"model_state.assign: no parameters named {unknown}")
        with torch.no_grad():
            for name, value in values.items():
                target = by_name[name].local(by_name[name].parameter)
                if tuple(value.shape) != tuple(target.shape):
                    raise ValueError(
                        f"model_state.assign: {name} is {tuple(target.shape)} on this rank, "
                        f"got {tuple(value.shape)}"
                    )
                target.copy_(value)

    # -- gradients and freezing -------------------------------------------------------

    def watch_gradients(self, watcher: Watcher) -> None:
        """Call ``watcher({name: gradient})`` at every ``before_clipping`` from now on."""
        self._watchers.append(watcher)

    @property
    def active(self) -> bool:
        """Whether ``before_clipping`` has anything to do (a watcher or a frozen name)."""
        return bool(self._watchers or self._frozen_parameters)

    def before_clipping(self) -> None:
        """Drop the frozen parameters' gradients, then show the rest to the watchers.

        Call after backward and gradient reduction, before clipping and the optimizer
        step; costs nothing while no callback watches or freezes."""
        for parameter in self._frozen_parameters:
            parameter.grad = None
        if not self._watchers:
            return
        gradients: dict[str, torch.Tensor] = {}
        local: dict[int, torch.Tensor | None] = {}
        for entry in self.entries:
            key = id(entry.parameter)
            if key not in local:
                local[key] = local_gradient(entry.parameter)
            grad = local[key]
            if grad is not None and entry.name not in self._frozen:
                gradients[entry.name] = entry.view(grad.detach())
        for watcher in self._watchers:
            watcher(gradients)

    def freeze(self, patterns: str | Sequence[str]) -> list[str]:
        """Freeze the matching names from the next step on; returns them."""
        names = self._matching(patterns, "freeze")
        self._frozen |= set(names)
        self._refresh_frozen()
        return names

    def unfreeze(self, patterns: str | Sequence[str]) -> list[str]:
        """Train the matching names again from the next step on; returns them."""
        names = self._matching(patterns, "unfreeze")
        self._frozen -= set(names)
        self._refresh_frozen()
        return names

    def _matching(self, patterns: str | Sequence[str], verb: str) -> list[str]:
        """The matching names; a pattern covering only some parts of a fused tensor is
        refused, naming the parts."""
        chosen = {entry.name for entry in self.entries if matches(entry.name, patterns)}
        for entry in self.entries:
            if entry.fused is None or entry.name not in chosen:
                continue
            parts = [e.name for e in self.entries if e.parameter is entry.parameter]
            missing = [name for name in parts if name not in chosen]
            if missing:
                raise ValueError(
                    f"cannot {verb} {entry.name} alone: it is part of the fused tensor "
                    f"{entry.fused} with {missing}; {verb} all of {parts} together"
                )
        return [entry.name for entry in self.entries if entry.name in chosen]

    def _refresh_frozen(self) -> None:
        parameters: dict[int, torch.nn.Parameter] = {}
        for entry in self.entries:
            if entry.name in self._frozen:
                parameters[id(entry.parameter)] = entry.parameter
        self._frozen_parameters = list(parameters.values())

    # -- optimizer --------------------------------------------------------------------

    def _groups(self) -> list[tuple[Any, dict[str, Any]]]:
        """``(optimizer, param_group)`` for every group of every optimizer, in order."""
        return [(opt, group) for opt in self.optimizers for group in opt.param_groups]

    def optimizer_groups(self) -> list[OptimizerGroup]:
        """Every optimizer's groups, numbered across optimizers in order."""
        names_of: dict[int, list[str]] = {}
        for entry in self.entries:
            names_of.setdefault(id(entry.parameter), []).append(entry.name)
        out = []
        for index, (_, group) in enumerate(self._groups()):
            names = [name for p in group["params"] for name in names_of.get(id(p), [])]
            out.append(
                OptimizerGroup(
                    index=index,
                    lr=float(group["lr"]),
                    weight_decay=float(group.get("weight_decay", 0.0)),
                    names=tuple(names),
                )
            )
        return out

    def set_hyperparameter(
        self, name: Hyperparameter, value: float, *, groups: Sequence[int] | None = None
    ) -> None:
        """Use ``value`` from the next step on; a learning-rate schedule is scaled to
        continue from it (see module)."""
        if name not in ("lr", "weight_decay"):
            raise ValueError(f"set_hyperparameter: unknown {name!r}; use 'lr' or 'weight_decay'")
        all_groups = self._groups()
        chosen = range(len(all_groups)) if groups is None else groups
        for index in chosen:
            if not 0 <= index < len(all_groups):
                raise IndexError(
                    f"set_hyperparameter: no optimizer group {index} (there are {len(all_groups)})"
                )
            optimizer, group = all_groups[index]
            if name == "weight_decay":
                group["weight_decay"] = float(value)
                continue
            self._set_lr(optimizer, group, float(value))

    def _set_lr(self, optimizer: Any, group: dict[str, Any], value: float) -> None:
        current = float(group["lr"])
        position = next(i for i, g in enumerate(optimizer.param_groups) if g is group)
        for scheduler in self.schedulers:
            scheduled = getattr(scheduler, "optimizer", None)
            if getattr(scheduled, "param_groups", None) is not optimizer.param_groups:
                continue  # (a wrapper, e.g. Fabric's, shares its optimizer's groups)
            base = scheduler.base_lrs[position]
            scheduler.base_lrs[position] = base * value / current if current else value
            if hasattr(scheduler, "_last_lr"):
                scheduler._last_lr[position] = value
        if "initial_lr" in group:
            initial = group["initial_lr"]
            group["initial_lr"] = initial * value / current if current else value
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value

    # -- reductions -------------------------------------------------------------------

    def sum_over_ranks(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Each named scalar summed over the ranks of ``group`` (one all-reduce)."""
        names = self._union(frozenset(values))  # (a rank with no names still takes part)
        if not names:
            return {}
        tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
        device = tensors[0].device if tensors else self._device()
        dtype = torch.float64  # the same on every rank (a rank may pass no values)
        zero = torch.zeros((), device=device, dtype=dtype)
        stacked = torch.stack(
            [
                torch.as_tensor(values[n], device=device, dtype=dtype).reshape(())
                if n in values
                else zero
                for n in names
            ]
        )
        if self._world() > 1:
            dist.all_reduce(stacked, group=self.group)
        return {name: stacked[i] for i, name in enumerate(names)}

    def _device(self) -> torch.device:
        """Where the model's tensors are (what the collectives run on)."""
        for entry in self.entries:
            return entry.local(entry.parameter).device
        return torch.device("cpu")

    def _world(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.group)

    def _union(self, local: frozenset[str]) -> list[str]:
        """The names over every rank for this rank's ``local`` names (gathered once)."""
        if local not in self._union_cache:
            if self._world() > 1:
                gathered: list[Any] = [None] * self._world()
                dist.all_gather_object(gathered, sorted(local), group=self.group)
                union = sorted({name for names in gathered for name in names})
            else:
                union = sorted(local)
            self._union_cache[local] = union
        return self._union_cache[local]

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """The backend's one-transfer fetch."""
        return self._fetch(values)

    # -- arrays beside a checkpoint ---------------------------------------------------

    def save_arrays(self, directory: Path, arrays: Mapping[str, Any]) -> None:
        """This rank's counted pieces of ``arrays`` into ``arrays-rank<r>.safetensors``."""
        torch_arrays.save(directory, arrays, self.parameters(), rank=self._rank())

    def load_arrays(self, directory: Path) -> dict[str, Any]:
        """What ``save_arrays`` wrote, as this rank's pieces (same layout, else refused)."""
        return torch_arrays.load(directory, self.parameters())

    def _rank(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 0
        return dist.get_rank()
