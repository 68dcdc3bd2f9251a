"""Where ``CompositeLogger`` sends metrics: one small module per destination.

A sink has ``open(driver)``, ``write(step, metrics, phase)`` and ``close()``;
``phase`` is ``"train"`` (a log step's metrics) or ``"eval"`` (an evaluation's). Sinks are
registered by name in ``SINKS`` so recipes and config files can say
``CompositeLogger(["jsonl", "tensorboard", "wandb", "mlflow", "console"])``. A sink that
has ``state_dict()`` / ``load_state_dict(state)`` (MLflow's run id) has that state kept
in every checkpoint by ``CompositeLogger``.

Example::

    from baton.callbacks.sinks import SINKS, JsonlSink

    sink = SINKS.build("jsonl")        # or JsonlSink(path="metrics.jsonl")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from baton.core.registry import Registry

if TYPE_CHECKING:
    from baton.core import DriverView

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


class MissingSinkPackage(ImportError):
    """A sink whose package is not installed; the message names the extra to install."""


def check_installed(name: str) -> None:
    """Raise ``MissingSinkPackage`` when sink ``name`` needs a package that is missing."""
    import importlib.util

    if name not in OPTIONAL_PACKAGES:
        return
    modules, extra = OPTIONAL_PACKAGES[name]
    for module in modules:
        if importlib.util.find_spec(module) is not None:
            continue
        raise MissingSinkPackage(
            f"the {name!r} log sink needs the {module} package: install it with "
            f"`pip install 'baton-callbacks[{extra}]'` (or `pip install {module}`), or leave "
            f"{name!r} out of CompositeLogger's sinks"
        )


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
]
