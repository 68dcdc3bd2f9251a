"""What a backend declares about itself for the commands and tests that never build it.

A backend's package declares one ``BackendDescriptor`` when it is imported (cheaply:
no framework is imported): its name and engine class, how its processes are launched,
the objectives it trains, where its Hugging Face exporter lives and how ``baton
compare`` runs it. ``declare_backend`` registers the engine lazily in
``BACKENDS`` and keeps the descriptor; ``baton export``, ``baton compare``, ``baton
submit`` and the conformance suite read ``backend_descriptors()``, so a backend that
declares itself appears in all of them. Installed packages announce their module
through the ``baton.plugins`` entry points, imported on the first lookup.

The objectives a descriptor names are objectives' registered names
(``baton.core.objectives.OBJECTIVES``: the shipped ``pretrain``, ``sft``, ``dpo``,
``grpo`` and any a package registers). They are checked when the descriptors are read,
once every plugin has been imported (a plugin may register its objective after it
declares the backend that runs it): a name no package registers is an
``UnknownObjectiveError`` naming the backend, the name and the registered ones.

Example::

    from baton.core.backend_descriptor import BackendDescriptor, declare_backend

    declare_backend(
        BackendDescriptor(
            name="mine",
            engine="mypkg.backend:MyBackend",
            summary="My framework's step, one call per baton step.",
            launcher="torchrun",                       # baton submit: torchrun per node
            objectives=("pretrain", "sft"),
            exporter="mypkg.export:export_hf",         # baton export --format hf
        )
    )
    backend_descriptor("mine").launcher               # "torchrun"
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Literal, Protocol, get_args

from baton.core.errors import UsageError, did_you_mean
from baton.core.registry import BACKENDS, UnknownNameError, load_plugins

#: how a backend's processes are started: ``torchrun`` (they meet through
#: torch.distributed; ``baton submit`` runs one torchrun per node), ``jax`` (through
#: ``jax.distributed``; one task per process) or ``single`` (one process)
Launcher = Literal["torchrun", "jax", "single"]
#: each launcher as the commands name it
LAUNCHER_NAMES: dict[Launcher, str] = {
    "torchrun": "torchrun",
    "jax": "jax.distributed",
    "single": "one process",
}
#: where a backend sits in the lists commands print, unless it says
DEFAULT_ORDER = 100


class UnknownObjectiveError(UsageError):
    """A backend descriptor names an objective no package registers (exit status 2)."""


class Exporter(Protocol):
    """``export_hf(checkpoint, out_dir) -> out_dir``: a checkpoint's weights written as
    a Hugging Face model directory."""

    def __call__(self, checkpoint_dir: str | Path, out_dir: str | Path, /) -> Path: ...


@dataclass(frozen=True)
class CompareRun:
    """How ``baton compare`` runs a backend: its recipe (a file of the project's
    ``recipes/``) and the recipe's own flags beside the settings every backend shares.
    Each flag is a format string of the comparison's ``{seq_len}`` (targets a sample),
    ``{window}`` (``seq_len + 1`` tokens: for a model that shifts its labels itself),
    ``{batch}`` (samples a step) and ``{after_last_step}`` (``steps + 1``: an evaluation
    cadence that never comes)."""

    recipe: str
    flags: tuple[str, ...] = ()

    def command_flags(self, *, seq_len: int, batch: int, steps: int) -> list[str]:
        """The recipe's own flags for a comparison of ``steps`` steps of ``batch``
        samples of ``seq_len`` targets."""
        values = {
            "seq_len": seq_len,
            "window": seq_len + 1,
            "batch": batch,
            "after_last_step": steps + 1,
        }
        return [flag.format(**values) for flag in self.flags]


@dataclass(frozen=True)
class BackendDescriptor:
    """One backend's facts, readable without importing its framework.

    Args:
        name: the name recipes, checkpoints and ``--backend`` use.
        engine: ``"package.module:Class"``, the backend class, imported on first use.
        summary: one line for ``baton backends``.
        launcher: how its processes are started (``Launcher``).
        objectives: the training objectives it runs, by their registered names
            (``"pretrain"``, ``"sft"``, ``"dpo"``, ``"grpo"``: ``OBJECTIVES``).
        exporter: ``"package.module:function"`` writing its checkpoints as a Hugging
            Face directory (``Exporter``); ``None`` where it has no mapping.
        compare: how ``baton compare`` runs it (``CompareRun``: its recipe and flags);
            ``None`` where it is not compared.
        order: where it sits in the lists commands print (lower first, then by name);
            ``baton compare``'s first backend is the one the others are compared with.
    """

    name: str
    engine: str
    summary: str = ""
    launcher: Launcher = "single"
    objectives: tuple[str, ...] = ("pretrain",)
    exporter: str | None = None
    compare: CompareRun | None = None
    order: int = DEFAULT_ORDER

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.name:
            problems.append("it has no name")
        if not _is_target(self.engine):
            problems.append(f"engine {self.engine!r} is not 'package.module:Class'")
        if self.launcher not in get_args(Launcher):
            problems.append(f"launcher {self.launcher!r} is not one of {get_args(Launcher)}")
        if not self.objectives:
            problems.append("it names no objective (('pretrain',) for next-token training)")
        if self.exporter is not None and not _is_target(self.exporter):
            problems.append(f"exporter {self.exporter!r} is not 'package.module:function'")
        if problems:
            raise ValueError(f"backend descriptor {self.name!r}: {'; '.join(problems)}")

    @property
    def exports_hf(self) -> bool:
        """Whether ``baton export --format hf`` writes its checkpoints."""
        return self.exporter is not None

    def load_exporter(self) -> Exporter:
        """The exporter function, imported now (with the backend's framework)."""
        if self.exporter is None:
            raise ValueError(f"backend {self.name!r} declares no Hugging Face exporter")
        module, _, function = self.exporter.partition(":")
        exporter: Exporter = getattr(import_module(module), function)
        return exporter


def _is_target(target: str) -> bool:
    module, colon, attribute = target.partition(":")
    return bool(module and colon and attribute)


#: name -> the descriptor a backend declared
_DECLARED: dict[str, BackendDescriptor] = {}


def declare_backend(descriptor: BackendDescriptor) -> BackendDescriptor:
    """Declare a backend: its engine registered lazily in ``BACKENDS`` under its name,
    its descriptor kept for ``backend_descriptors``. Declaring the same descriptor again
    changes nothing; another under a declared name is a ``ValueError``."""
    known = _DECLARED.get(descriptor.name)
    if known is not None and known != descriptor:
        raise ValueError(f"backend {descriptor.name!r} is already declared: {known}")
    _DECLARED[descriptor.name] = descriptor
    BACKENDS.add_lazy(descriptor.name, descriptor.engine, descriptor.summary)
    return descriptor


def backend_descriptors() -> tuple[BackendDescriptor, ...]:
    """Every declared backend (installed plugins imported first), by ``order`` then name;
    ``UnknownObjectiveError`` if one names an objective no package registers."""
    load_plugins()
    declared = tuple(sorted(_DECLARED.values(), key=lambda d: (d.order, d.name)))
    for descriptor in declared:
        check_objectives(descriptor)
    return declared


def check_objectives(descriptor: BackendDescriptor) -> None:
    """``UnknownObjectiveError`` unless every objective ``descriptor`` names is registered
    (``baton.core.objectives.OBJECTIVES``)."""
    from baton.core.objectives import OBJECTIVES

    known = OBJECTIVES.names()
    for name in descriptor.objectives:
        if name not in known:
            close = did_you_mean(name, known)
            hint = f" (did you mean {close!r}?)" if close else ""
            raise UnknownObjectiveError(
                f"backend {descriptor.name!r} declares objective {name!r}{hint}, which no "
                f"package registers; name one of {', '.join(known)} in its objectives, or "
                "register the objective (register_objective) where the backend is declared"
            )


def backend_descriptor(name: str) -> BackendDescriptor:
    """The descriptor of backend ``name``; ``UnknownNameError`` lists the declared ones."""
    for descriptor in backend_descriptors():
        if descriptor.name == name:
            return descriptor
    known = ", ".join(d.name for d in backend_descriptors()) or "(none)"
    raise UnknownNameError(f"unknown backend {name!r}; declared backends: {known}")
