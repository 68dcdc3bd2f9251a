"""Where ``CompositeLogger`` sends metrics: one small module per destination.

A sink has ``open(driver)``, ``write(step, metrics, phase)`` and ``close()``;
``phase`` is ``"train"`` (a log step's metrics) or ``"eval"`` (an evaluation's). Sinks are
registered by name in ``SINKS`` so recipes and config files can say
``CompositeLogger(["jsonl", "tensorboard", "wandb", "mlflow", "console"])``. A sink that
has ``state_dict()`` / ``load_state_dict(state)`` (MLflow's run id) has that state kept
in every checkpoint by ``CompositeLogger``.

A default set of sinks never stops a run: ``installed_sinks`` leaves out those whose
package is missing, with one log line each saying how to add it; a sink named by the
user (``build_sink``) still refuses in one line naming the package.

Example::

    from baton.callbacks.sinks import SINKS, JsonlSink, installed_sinks

    sink = SINKS.build("jsonl")        # or JsonlSink(path="metrics.jsonl")
    installed_sinks(["jsonl", "tensorboard"])   # ["jsonl"] where crc32c is missing
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from baton.core.errors import UsageError
from baton.core.registry import Registry

if TYPE_CHECKING:
    from baton.core import DriverView

log = logging.getLogger("baton")

#: which phase a batch of metrics belongs to
Phase = Literal["train", "eval"]


@runtime_checkable
class Sink(Protocol):
    """A destination for logged metrics."""

    name: str

    def open(self, driver: DriverView) -> None: ...

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class StatefulSink(Sink, Protocol):
    """A sink whose state (JSON-serialisable) travels in checkpoints."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


SINKS: Registry[type] = Registry("log sink")
SINKS.add_lazy("jsonl", "baton.callbacks.sinks.jsonl:JsonlSink")
SINKS.add_lazy("tensorboard", "baton.callbacks.sinks.tensorboard:TensorBoardSink")
SINKS.add_lazy("wandb", "baton.callbacks.sinks.wandb:WandbSink")
SINKS.add_lazy("mlflow", "baton.callbacks.sinks.mlflow:MlflowSink")
SINKS.add_lazy("console", "baton.callbacks.sinks.console:ConsoleSink")

#: sink name -> (the modules it needs, the baton-callbacks extra that installs them)
OPTIONAL_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard", "crc32c"), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
    "mlflow": (("mlflow",), "mlflow"),
}


class MissingSinkPackage(UsageError, ImportError):
    """A sink whose package is not installed; the message names the extra to install
    (a usage error: one line, exit status 2)."""


def missing_package(name: str) -> str | None:
    """The first package sink ``name`` needs that is not installed (``None``: none)."""
    import importlib.util

    modules, _ = OPTIONAL_PACKAGES.get(name, ((), ""))
    for module in modules:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a parent package that fails, a broken entry
            found = None
        if found is None:
            return module
    return None


def install_hint(name: str, module: str) -> str:
    """How to install what sink ``name`` needs (its baton-callbacks extra, or ``module``)."""
    extra = OPTIONAL_PACKAGES[name][1]
    return f"`pip install 'baton-callbacks[{extra}]'` (or `pip install {module}`)"


def check_installed(name: str) -> None:
    """Raise ``MissingSinkPackage`` when sink ``name`` needs a package that is missing."""
    module = missing_package(name)
    if module is None:
        return
    raise MissingSinkPackage(
        f"the {name!r} log sink needs the {module} package: install it with "
        f"{install_hint(name, module)}, or leave {name!r} out of CompositeLogger's sinks"
    )


def installed_sinks[S](sinks: Sequence[S]) -> list[S]:
    """``sinks`` (names or sink objects) without the named ones whose package is missing,
    each left out with one log line naming the package and how to add it: what a
    default set of sinks does, so that a default never stops a run."""
    kept: list[S] = []
    for sink in sinks:
        module = missing_package(sink) if isinstance(sink, str) else None
        if module is None:
            kept.append(sink)
            continue
        log.info(
            "log sink %r left out: it needs the %s package, which is not installed; add it with %s",
            sink,
            module,
            install_hint(str(sink), module),
        )
    return kept


def build_sink(name: str, **arguments: Any) -> Sink:
    """The registered sink ``name`` (built with ``arguments``), after checking that its
    package is installed."""
    check_installed(name)
    return SINKS.build(name, **arguments)


__all__ = [
    "SINKS",
    "MissingSinkPackage",
    "Phase",
    "Sink",
    "StatefulSink",
    "build_sink",
    "check_installed",
    "installed_sinks",
    "missing_package",
]
