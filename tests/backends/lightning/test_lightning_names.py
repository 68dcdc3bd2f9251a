"""A LightningModule's own names and the run directory, as the module sees them.

The validation values a module logs (``self.log("val_loss")``) reach callbacks, the
console line and every sink under the names it logged; ``EarlyStopping`` and
``Checkpoint`` monitor them by those names; ``self.trainer.log_dir`` is the run's log
directory."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import lightning.pytorch as pl

from baton.backends.fabric import FabricConfig
from baton.backends.lightning import LightningBackend
from baton.callbacks import CONSOLE_KEYS, Checkpoint, CompositeLogger, EarlyStopping
from baton.callbacks.sinks.console import ConsoleSink
from baton.callbacks.sinks.jsonl import JsonlSink
from baton.core import Callback, Driver

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_lightning import lit  # the recipe's classifier: logs val_loss and val_acc

EVAL_EVERY = 4


class ReadsLogDir(lit.LitClassifier):
    """Where modules usually read it: when fitting starts, and at validation."""

    def __init__(self) -> None:
        super().__init__()
        self.log_dirs: list[str | None] = []

    def on_fit_start(self) -> None:
        self.log_dirs.append(self.trainer.log_dir)

    def on_validation_epoch_end(self) -> None:
        self.log_dirs.append(self.trainer.log_dir)


class Evaluations(Callback):
    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def on_eval_end(self, driver, metrics):
        self.seen.append(dict(metrics))


def test_module_names_reach_callbacks_sinks_and_monitors(tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    module = ReadsLogDir()
    backend = LightningBackend(
        module, datamodule=lit.BlobsDataModule(), config=FabricConfig(accelerator="cpu")
    )
    console = io.StringIO()
    evaluations = Evaluations()
    early = EarlyStopping("val_loss", patience=100)
    best = Checkpoint(every_n_steps=EVAL_EVERY, keep_last=1, keep_best=1, monitor="val_loss")
    run_dir = tmp_path / "run"
    logger = CompositeLogger(
        [ConsoleSink(CONSOLE_KEYS, stream=console), JsonlSink()], threaded=False
    )
    Driver(
        backend,
        [evaluations, early, best, logger],
        max_steps=3 * EVAL_EVERY,
        log_every=EVAL_EVERY,
        eval_every=EVAL_EVERY,
        run_dir=run_dir,
    ).fit()

    # callbacks: the names the module logged, nothing renamed
    assert len(evaluations.seen) == 3
    assert all({"val_loss", "val_acc"} <= set(seen) for seen in evaluations.seen)
    assert not any(key.startswith("eval/") for seen in evaluations.seen for key in seen)
    losses = [seen["val_loss"] for seen in evaluations.seen]
    # monitors read them in the evaluation phase
    assert early.best == min(losses)
    scores = {
        path.name: json.loads((path / "baton.json").read_text()).get("checkpoint_score")
        for path in (run_dir / "checkpoints").glob("step_*")
    }
    best_step = (losses.index(min(losses)) + 1) * EVAL_EVERY
    assert scores[f"step_{best_step:06d}"] == {"val_loss": min(losses)}
    # the console line and the jsonl sink: val_loss as logged, in the eval phase
    eval_lines = [line for line in console.getvalue().splitlines() if line.startswith("eval")]
    assert len(eval_lines) == 3 and all("| val_loss " in line for line in eval_lines)
    records = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").open()]
    evals = [r for r in records if r["phase"] == "eval"]
    assert [r["val_loss"] for r in evals] == losses
    assert all("val_acc" in r for r in evals)
    # self.trainer.log_dir: the run's log directory, where the sinks write
    assert len(module.log_dirs) >= 4  # fit start, the sanity check, 3 validations
    assert set(module.log_dirs) == {str(run_dir / "logs")}
