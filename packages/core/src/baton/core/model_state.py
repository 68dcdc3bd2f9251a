"""Ability ``model_state``: callbacks that touch the model, written once for every backend.

A backend with this ability returns a ``ModelState`` from ``model_state()`` (after
``setup``). Through it a callback reads the parameters by name, sees the gradients
before clipping, reads and sets the optimizer's learning rate and weight decay, and
freezes or unfreezes parameters, with the same code on Fabric, the LightningModule
backend, the JAX backend, TorchTitan, Megatron-Core and MaxText.

Arrays stay where they are and stay the framework's own (``torch.Tensor``,
``jax.Array``); a callback does its math through the array API standard::

    from array_api_compat import array_namespace

    class AttentionOutputRMS(Callback):
        '''Log the RMS of every attention output projection's weights.'''

        def requires(self):
            return frozenset({"model_state"})

        def on_log(self, driver, metrics):
            state = driver.backend.model_state()
            squares, sizes = {}, {}
            for piece in state.parameters("*.self_attn.o_proj.weight"):
                xp = array_namespace(piece.value)
                if piece.counted:
                    squares[piece.name] = xp.sum(piece.value * piece.value)
                sizes[piece.name] = piece.size
            for name, total in state.fetch(state.sum_over_ranks(squares)).items():
                metrics[f"rms/{name}"] = (total / sizes[name]) ** 0.5

Names: for a model built from the shared model spec (``baton.core.model.spec``) every
backend uses the Hugging Face names (``model.layers.0.self_attn.q_proj.weight``); for
the user's own model, the framework's own names (``net.0.weight``). A tensor the
framework keeps fused (Megatron-Core's QKV and gate/up projections, MaxText's layers
scanned into one stacked array) is shown as its Hugging Face parts, each a view into
the fused array (``Piece.fused`` names the fused tensor: its parts freeze together).

Layouts: ``Piece.value`` is what this rank holds (a tensor-parallel or FSDP shard, a
pipeline stage's layers, a data-parallel replica); ``global_shape`` and ``index`` say
which slice of the whole tensor it is. A JAX array is already global (sharded across
devices): its ``index`` covers the whole tensor. ``counted`` is true on exactly one
holder of each element, so a sum of per-piece values over ranks, taken by
``sum_over_ranks``, is the whole model's whatever the layout (a norm is the same number
on one rank, under TP 2, FSDP 2 or PP 2).

Nothing is computed unless a callback asks: ``parameters()`` returns views, not copies;
``watch_gradients`` installs its hook only when first called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

#: a hyperparameter a callback may read and set per optimizer parameter group
Hyperparameter = Literal["lr", "weight_decay"]


@dataclass(frozen=True)
class Piece:
    """One named parameter as this rank holds it.

    ``value`` is the framework's array (a view: for torch, in-place changes reach the
    model; use ``ModelState.assign`` to write portably). ``index`` has one ``slice`` per
    dimension of ``global_shape``: where ``value`` sits in the whole tensor.
    """

    name: str
    value: Any
    global_shape: tuple[int, ...]
    index: tuple[slice, ...]
    #: this rank's copy counts in sums over ranks (one holder per element)
    counted: bool = True
    #: the framework's name of the fused tensor this piece is a view of, if any
    fused: str | None = None
    #: the parameter is frozen (``ModelState.freeze``): no update, no optimizer change
    frozen: bool = False

    @property
    def size(self) -> int:
        """Number of elements of the whole tensor (not of this rank's piece)."""
        total = 1
        for extent in self.global_shape:
            total *= extent
        return total


@dataclass(frozen=True)
class OptimizerGroup:
    """One optimizer parameter group: its current hyperparameters and its parameters'
    names (the names ``ModelState.parameters`` uses)."""

    index: int
    lr: float
    weight_decay: float
    names: tuple[str, ...]


@runtime_checkable
class ModelState(Protocol):
    """The model, gradients and optimizer of a built run, seen the same on every backend.

    Name patterns are ``fnmatch`` globs over the names (``"model.layers.0.*"``,
    ``"*embed_tokens*"``); a list matches a name that any pattern matches.
    """

    def parameters(self, patterns: str | Sequence[str] = "*") -> list[Piece]:
        """The model's parameters whose names match, frozen ones included (``Piece.frozen``)."""
        ...

    def watch_gradients(self, watcher: Callable[[Mapping[str, Any]], None]) -> None:
        """Call ``watcher({name: gradient})`` after backward and before clipping and the
        optimizer step, each gradient shaped like that name's ``Piece.value`` (and on the
        same ranks); frozen parameters are left out. Installed on first call."""
        ...

    def sum_over_ranks(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Sum each named scalar over every rank (lazy arrays in, lazy arrays out).

        Ranks may pass different names (pipeline stages hold different layers): a name
        missing on a rank counts as zero there. Every rank calls it at the same step (a
        collective where there are several ranks)."""
        ...

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Bring lazy scalars to the host in one transfer (the backend's ``fetch``)."""
        ...

    def optimizer_groups(self) -> list[OptimizerGroup]:
        """The optimizer's parameter groups with the learning rate and weight decay the
        next step will use."""
        ...

    def set_hyperparameter(
        self, name: Hyperparameter, value: float, *, groups: Sequence[int] | None = None
    ) -> None:
        """Use ``value`` for ``name`` from the next step on, in ``groups`` (all when
        ``None``). The backend's learning-rate schedule continues from the value set
        (later steps are scaled by the schedule's ratio to its value at this step);
        each backend's docstring says exactly how."""
        ...

    def freeze(self, patterns: str | Sequence[str]) -> list[str]:
        """Freeze the matching parameters from the next step on: no update and no
        optimizer-state change while frozen. Returns the names frozen. A pattern that
        matches part of a fused tensor whose parts the backend cannot mask separately
        (Megatron-Core's and TorchTitan's fused QKV, gate/up) is refused (``ValueError``
        naming the parts); MaxText's layers scanned into one array freeze one by one."""
        ...

    def unfreeze(self, patterns: str | Sequence[str]) -> list[str]:
        """Train the matching parameters again from the next step on; returns the names."""
        ...

    def assign(self, values: Mapping[str, Any]) -> None:
        """Write arrays into the named parameters (each shaped like its ``Piece.value``),
        e.g. to evaluate with averaged weights."""
        ...

    def save_arrays(self, directory: Path, arrays: Mapping[str, Any]) -> None:
        """Write named arrays shaped like the pieces (a callback's state too large for
        ``baton.json``, e.g. averaged weights) into ``directory``: this rank's counted
        pieces with their names, global shapes and indices, one safetensors file per
        rank (``arrays-rank<r>.safetensors``), so a tool can assemble whole tensors."""
        ...

    def load_arrays(self, directory: Path) -> dict[str, Any]:
        """Read back what ``save_arrays`` wrote, as arrays placed like this run's pieces
        (the same layout; a different one is refused naming both)."""
        ...


def matches(name: str, patterns: str | Sequence[str]) -> bool:
    """Whether ``name`` matches the glob ``patterns`` (one or several).

    >>> matches("model.layers.0.mlp.up_proj.weight", ["*.mlp.*", "lm_head*"])
    True
    >>> matches("model.norm.weight", "model.layers.*")
    False
    """
    from fnmatch import fnmatchcase

    if isinstance(patterns, str):
        patterns = [patterns]
    return any(fnmatchcase(name, pattern) for pattern in patterns)
