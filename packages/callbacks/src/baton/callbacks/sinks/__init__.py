"""Where ``CompositeLogger`` sends metrics: one small module per destination.

A sink has ``open(driver)``, ``write(step, metrics, phase)`` and ``close()``;
``phase`` is ``"train"`` (a log step's metrics) or ``"eval"`` (an evaluation's). Sinks are
registered by name in ``SINKS`` so recipes and config files can say
``CompositeLogger(["jsonl", "tensorboard", "wandb", "console"])``.

Example::

    from baton.callbacks.sinks import SINKS, JsonlSink

    sink = SINKS.build("jsonl")        # or JsonlSink(path="metrics.jsonl")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from baton.core.registry import Registry

if TYPE_CHECKING:
    from baton.core import Driver

#: which phase a batch of metrics belongs to
Phase = Literal["train", "eval"]


@runtime_checkable
class Sink(Protocol):
    """A destination for logged metrics."""

    name: str

    def open(self, driver: Driver) -> None: ...

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None: ...

    def close(self) -> None: ...


SINKS: Registry[type] = Registry("log sink")
SINKS.add_lazy("jsonl", "baton.callbacks.sinks.jsonl:JsonlSink")
SINKS.add_lazy("tensorboard", "baton.callbacks.sinks.tensorboard:TensorBoardSink")
SINKS.add_lazy("wandb", "baton.callbacks.sinks.wandb:WandbSink")
SINKS.add_lazy("console", "baton.callbacks.sinks.console:ConsoleSink")

#: sink name -> (the modules it needs, the baton-callbacks extra that installs them)
OPTIONAL_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard", "crc32c"), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
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


def build_sink(name: str) -> Sink:
    """The registered sink ``name``, after checking that its package is installed."""
    check_installed(name)
    return SINKS.build(name)


__all__ = ["SINKS", "MissingSinkPackage", "Phase", "Sink", "build_sink", "check_installed"]
