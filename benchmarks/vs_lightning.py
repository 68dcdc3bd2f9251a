"""Against Lightning: one tiny GPT trained by a hand-written loop, by baton, by Lightning.

The same model (``baton.backends.fabric.models.gpt``'s GPT), data (its byte windows in a seeded
``StatefulDataLoader``), optimizer (AdamW, two parameter groups), gradient clipping (norm
1.0) and warmup-cosine schedule, trained for N steps by:

(a) a hand-written PyTorch loop: exactly the Fabric backend's math, and a loss read
    every 10 steps (the same logging cadence);
(b) baton's Fabric backend (the model, optimizer factory, scheduler and data handed to
    ``FabricBackend``) driven by ``Driver`` with the standard callbacks (checkpointing
    off, logging every 10 steps: ``Progress``);
(a') the same step written by hand against Fabric's API (what a Fabric user writes):
    b/a' is the driver's own cost, a'/a the Fabric layer's;
(c) ``lightning.pytorch.Trainer.fit`` on a LightningModule (``GPTModule``) with its
    defaults minus checkpointing (its logger and progress bar stay; ``log_every_n_steps=10``);
(d) baton's ``LightningBackend`` on the same LightningModule, the same callbacks as (b):
    d/c compares the two loops over one module.

Reports time per step and the paired ratios b/a, c/a and d/c. (a) and (b) must produce
the same losses bit for bit, and so must (c) and (d); the table says whether they did.
The loops run side by side, each in a process of its own (as users run them), taking
turns one block of 10 steps at a time (``harness.Lockstep``); a block ends with its log
step, whose loss read also synchronises a GPU, so each block's time is complete. Time per step is the median block
over 10; ratios are medians of per-block pairs. Where CUDA is available all run on the GPU.

Run alone: ``uv run python benchmarks/run.py --only lightning``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from baton.backends.fabric import FabricConfig
from baton.backends.fabric.models.gpt import (
    GPT,
    GPTConfig,
    GPTTraining,
    adamw,
    byte_loaders,
    warmup_cosine,
)
from baton.backends.lightning import LightningBackend
from baton.callbacks import Progress
from baton.core import Callback, Driver
from benchmarks.harness import Lockstep, Row, at_most, median, paired_ratio

NAME = "lightning"
LOG_EVERY = 10
#: baton may cost at most this much more per step than the hand-written loop
TARGET_BATON = 1.02
#: baton's LightningBackend takes less than this share of Trainer.fit's time per step
TARGET_VS_TRAINER = 0.85


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def config(steps: int, quick: bool) -> GPTTraining:
    """The one configuration all loops train (tiny: driver costs show up)."""
    model = (
        GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32)
        if quick
        else GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32)
    )
    return GPTTraining(
        model=model,
        batch_size=8,
        lr=1e-3,
        warmup_steps=min(10, steps),
        decay_steps=steps,
        grad_clip=1.0,
        seed=0,
        accelerator=device(),
    )


def build(cfg: GPTTraining) -> tuple[GPT, torch.optim.Optimizer, Any, Iterator[Any]]:
    """Model, optimizer, scheduler and batches exactly as ``cfg.backend()`` builds them."""
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model).to(cfg.accelerator)
    optimizer = adamw(cfg.lr, cfg.weight_decay, cfg.betas)(model)
    scheduler = warmup_cosine(cfg.warmup_steps, cfg.decay_steps, cfg.min_lr_ratio)(optimizer)
    loader, _ = byte_loaders(seq_len=cfg.model.seq_len, batch_size=cfg.batch_size, seed=cfg.seed)
    return model, optimizer, scheduler, _endless(loader)


def _endless(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


Mark = Callable[[], None]


class LogSteps:
    """Called on every log step: keeps the loss, then ends the block (``mark``)."""

    def __init__(self, mark: Mark) -> None:
        self.mark = mark
        self.losses: list[float] = []

    def __call__(self, loss: float) -> None:
        self.losses.append(loss)
        self.mark()


# -- (a) the hand-written loop ---------------------------------------------------------------
def hand_loop(steps: int, cfg: GPTTraining, mark: Mark) -> list[float]:
    model, optimizer, scheduler, batches = build(cfg)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    dev = torch.device(cfg.accelerator)
    log = LogSteps(mark)
    for step in range(1, steps + 1):
        model.train()
        x, y = next(batches)
        x, y = x.to(dev), y.to(dev)
        loss = model(x, y)
        loss.backward()
        total = loss.detach()
        torch.nn.utils.clip_grad_norm_(params, max_norm=cfg.grad_clip, error_if_nonfinite=True)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % LOG_EVERY == 0:
            log(total.item())
    return log.losses


# -- (a') the same loop written against Fabric's API -----------------------------------------
def fabric_loop(steps: int, cfg: GPTTraining, mark: Mark) -> list[float]:
    """What a Fabric user writes by hand: the Fabric backend's step, without baton's driver."""
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator=cfg.accelerator, devices=1, precision=cfg.precision)  # type: ignore[arg-type]
    model, optimizer, scheduler, batches = build(cfg)
    model, optimizer = fabric.setup(model, optimizer)
    log = LogSteps(mark)
    for step in range(1, steps + 1):
        model.train()
        x, y = fabric.to_device(next(batches))
        loss = model(x, y)
        fabric.backward(loss)
        total = loss.detach()
        fabric.clip_gradients(model, optimizer, max_norm=cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % LOG_EVERY == 0:
            log(total.item())
    return log.losses


# -- (b) baton -------------------------------------------------------------------------------
class _LogClock(Callback):
    """Reads the clock and the loss on log steps (``on_log`` only: no per-step dispatch)."""

    priority = 1000  # after the standard callbacks' on_log

    def __init__(self, mark: Mark) -> None:
        self.log = LogSteps(mark)

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.log(metrics["loss"])


def baton_loop(steps: int, cfg: GPTTraining, run_dir: Path, mark: Mark) -> list[float]:
    return _drive(cfg.backend(), steps, run_dir, mark)


def _drive(backend: Any, steps: int, run_dir: Path, mark: Mark) -> list[float]:
    recorder = _LogClock(mark)
    quiet = Console(file=io.StringIO(), force_terminal=False)
    callbacks = [Progress(console=quiet), recorder]
    driver = Driver(backend, callbacks, max_steps=steps, log_every=LOG_EVERY, run_dir=run_dir)
    driver.fit()
    return recorder.log.losses


# -- (c) Lightning and (d) baton, over one LightningModule -----------------------------------
def gpt_module(cfg: GPTTraining) -> Any:
    """The GPT with its optimizer, schedule and data as a LightningModule (one per loop)."""
    import lightning.pytorch as pl

    class GPTModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(cfg.seed)
            self.model = GPT(cfg.model)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            loss = self.model(*batch)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = adamw(cfg.lr, cfg.weight_decay, cfg.betas)(self.model)
            schedule = warmup_cosine(cfg.warmup_steps, cfg.decay_steps, cfg.min_lr_ratio)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule(optimizer), "interval": "step"},
            }

        def train_dataloader(self) -> Any:
            seq_len, batch = cfg.model.seq_len, cfg.batch_size
            return byte_loaders(seq_len=seq_len, batch_size=batch, seed=cfg.seed)[0]

    return GPTModule()


def lightning_baton_loop(steps: int, cfg: GPTTraining, run_dir: Path, mark: Mark) -> list[float]:
    settings = FabricConfig(accelerator=cfg.accelerator, grad_clip=cfg.grad_clip)
    return _drive(LightningBackend(gpt_module(cfg), config=settings), steps, run_dir, mark)


def lightning_loop(steps: int, cfg: GPTTraining, run_dir: Path, mark: Mark) -> list[float]:
    import lightning.pytorch as pl

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.log_steps = LogSteps(mark)

        def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            if trainer.global_step % LOG_EVERY == 0:
                self.log_steps(float(trainer.callback_metrics["train_loss"]))

    clock = Clock()
    with _quiet():
        trainer = pl.Trainer(
            max_steps=steps,
            accelerator=cfg.accelerator,
            devices=1,
            enable_checkpointing=False,
            log_every_n_steps=LOG_EVERY,
            gradient_clip_val=cfg.grad_clip,
            default_root_dir=run_dir,
            callbacks=[clock],
        )
        trainer.fit(gpt_module(cfg))
    return clock.log_steps.losses


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Lightning's banners, warnings and progress bar go nowhere (they still run)."""
    names = ("lightning.pytorch", "lightning.fabric", "lightning")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stderr(io.StringIO()),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


# -- the benchmark ----------------------------------------------------------------------------
CASES = {
    "a": "(a) hand-written PyTorch loop",
    "f": "(a') hand-written Fabric loop",
    "b": "(b) baton + Fabric backend",
    "c": "(c) lightning.pytorch.Trainer",
    "d": "(d) baton + LightningBackend",
}


def lockstep(keys: str, steps: int, cfg: GPTTraining, root: Path) -> tuple[dict, dict]:
    """Run the loops named by ``keys`` side by side; return (per-step samples, losses)."""
    loops: dict[str, tuple[Callable[..., list[float]], tuple[Any, ...]]] = {
        "a": (hand_loop, (steps, cfg)),
        "f": (fabric_loop, (steps, cfg)),
        "b": (baton_loop, (steps, cfg, root / "baton")),
        "c": (lightning_loop, (steps, cfg, root / "lightning")),
        "d": (lightning_baton_loop, (steps, cfg, root / "baton_lightning")),
    }
    blocks, losses = Lockstep({key: loops[key] for key in keys}).run()
    # block 0 holds setup and warm-up; every other block is LOG_EVERY steps ending in a log step
    samples = {key: [t / LOG_EVERY for t in times[1:]] for key, times in blocks.items()}
    return samples, losses


def run(quick: bool = False) -> list[Row]:
    steps = 20 if quick else 300
    cfg = config(steps, quick)
    with tempfile.TemporaryDirectory(prefix="baton-bench-lightning-") as tmp:
        samples, losses = lockstep("afbcd", steps, cfg, Path(tmp))

    def equal_note(losses: dict[str, list[float]], key: str, to: str = "a") -> str:
        same = losses[key] == losses[to]
        return f"losses equal to ({to}) bit for bit" if same else f"losses differ from ({to})"

    def row(
        samples: dict, key: str, baseline: str, target: float | None = None, note: str = ""
    ) -> Row:
        ratio = paired_ratio(samples[key], samples[baseline])
        return Row(
            NAME,
            CASES[key],
            median(samples[key]) * 1e3,
            "ms/step",
            ratio=ratio,
            baseline=baseline,
            target=f"<= {target}" if target else "",
            passed=at_most(ratio, target) if target else None,
            note=note,
        )

    where = f"{steps} steps in lockstep blocks of {LOG_EVERY}, one process each, {device()}"
    d_over_c = paired_ratio(samples["d"], samples["c"])
    return [
        Row(NAME, CASES["a"], median(samples["a"]) * 1e3, "ms/step", note=where),
        row(samples, "f", "a", note=equal_note(losses, "f") + "; the Fabric layer"),
        row(samples, "b", "a", TARGET_BATON, note=equal_note(losses, "b")),
        row(samples, "b", "f", note="the driver alone (same Fabric calls on both sides)"),
        row(samples, "c", "a", note=equal_note(losses, "c")),
        row(samples, "d", "a", note="the same LightningModule as (c)"),
        Row(
            NAME,
            "(d) baton vs (c) Lightning, one module",
            None,
            "",
            ratio=d_over_c,
            baseline="c",
            target=f"< {TARGET_VS_TRAINER}",
            passed=d_over_c < TARGET_VS_TRAINER,
            note=equal_note(losses, "d", "c"),
        ),
    ]
