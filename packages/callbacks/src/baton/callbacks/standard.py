"""The callback stack most runs want, in one call, so a recipe states only what differs.

Example::

    from baton.callbacks import LossGuard, standard_callbacks

    callbacks = standard_callbacks(save_every=100, async_save=True)
    callbacks = standard_callbacks(save_every=500, keep_last=3, progress=False,
                                   extra=[LossGuard(action="rollback")])

Gives, in this order: ``Checkpoint`` (every ``save_every`` steps and/or
``save_every_minutes``, on stop, rotation keeping ``keep_last``), ``Preemption``
(SIGTERM/SIGUSR1 save and exit 0), ``ThroughputMonitor``, ``CompositeLogger`` (JSONL,
TensorBoard and a console line of ``console_keys``), ``Progress`` (a live bar), then
``extra``. Each part can be switched off; priorities order them, not the list.

The default sinks leave out one whose package is missing (TensorBoard without
``tensorboard`` or ``crc32c``), with one log line saying how to add it, so a minimal
install still trains; sinks given by name refuse a missing package in one line.
"""

from __future__ import annotations

from collections.abc import Sequence

from baton.callbacks.checkpoint import Checkpoint
from baton.callbacks.composite_logger import CompositeLogger
from baton.callbacks.preemption import Preemption
from baton.callbacks.progress import Progress
from baton.callbacks.sinks import Sink, check_installed, installed_sinks
from baton.callbacks.sinks.console import ConsoleSink
from baton.callbacks.sinks.wandb import WandbSink
from baton.callbacks.throughput import ThroughputMonitor
from baton.core.callback import Callback

#: the sinks ``standard_callbacks`` writes to by default (besides the console line)
STANDARD_SINKS: tuple[str, ...] = ("jsonl", "tensorboard")
#: printed on every log step and evaluation (the loss visibly falls in any terminal);
#: ``a|b`` shows ``a``, else ``b`` (tokens/s for token models, else samples/s; a
#: LightningModule's ``val_loss`` where evaluation keeps the module's names)
CONSOLE_KEYS: tuple[str, ...] = (
    "loss",
    "eval/loss|val_loss",
    "grad_norm",
    "lr",
    "throughput/tokens_per_s|throughput/samples_per_s",
)


def standard_callbacks(
    *,
    save_every: int | None = None,
    save_every_minutes: float | None = None,
    keep_last: int | None = 2,
    save_on_stop: bool = True,
    async_save: bool = False,
    checkpoint: bool = True,
    preemption: bool = True,
    throughput: bool = True,
    sinks: Sequence[str | Sink] = STANDARD_SINKS,
    console_keys: Sequence[str] | None = CONSOLE_KEYS,
    progress: bool = True,
    wandb_project: str | None = None,
    wandb_mode: str | None = None,
    extra: Sequence[Callback] = (),
) -> list[Callback]:
    """Checkpoint, Preemption, ThroughputMonitor, CompositeLogger, Progress, then ``extra``.

    Args:
        save_every: save every this many steps (``None``/0: not by steps; checkpoints
            are still written on stop).
        save_every_minutes: save every this many minutes (``None``/0: not by time).
        keep_last: checkpoints kept by rotation (``None``: all).
        save_on_stop: write a checkpoint whenever the run stops.
        async_save: save in the background where the backend can.
        checkpoint: include ``Checkpoint``.
        preemption: include ``Preemption``.
        throughput: include ``ThroughputMonitor``.
        sinks: the logger's sinks besides the console line (the default leaves out a
            sink whose package is missing, saying so; named ones refuse it).
        console_keys: keys of the console line (``None``: no console line).
        progress: include ``Progress`` (the progress bar).
        wandb_project: also log to this W&B project.
        wandb_mode: W&B's mode (``online``, ``offline``, ``disabled``; ``None``:
            ``$WANDB_MODE`` or online).
        extra: further callbacks, appended.
    """
    callbacks: list[Callback] = []
    if checkpoint:
        callbacks.append(
            Checkpoint(
                every_n_steps=save_every or None,
                every_minutes=save_every_minutes or None,
                save_on_stop=save_on_stop,
                keep_last=keep_last,
                async_save=async_save,
            )
        )
    if preemption:
        callbacks.append(Preemption())
    if throughput:
        callbacks.append(ThroughputMonitor())
    logger = standard_logger(sinks, console_keys, wandb_project, wandb_mode)
    if logger is not None:
        callbacks.append(logger)
    if progress:
        callbacks.append(Progress())
    callbacks.extend(extra)
    return callbacks


def standard_logger(
    sinks: Sequence[str | Sink],
    console_keys: Sequence[str] | None,
    wandb_project: str | None,
    wandb_mode: str | None,
) -> Callback | None:
    """The ``CompositeLogger`` of ``standard_callbacks``: ``sinks``, then W&B where a
    project is given, then the console line (``console_keys``); ``None`` with no sink."""
    if sinks is STANDARD_SINKS:  # a default never stops a run
        sinks = installed_sinks(STANDARD_SINKS)
    console = [ConsoleSink(console_keys)] if console_keys is not None else []
    wandb: list[Sink] = []
    if wandb_project:
        check_installed("wandb")
        wandb.append(WandbSink(project=wandb_project, mode=wandb_mode))
    if sinks or console or wandb:
        return CompositeLogger([*sinks, *wandb, *console])
    return None
