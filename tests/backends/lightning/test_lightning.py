"""A LightningModule, unchanged: baton's per-step losses equal Trainer.fit's bit for bit."""

from __future__ import annotations

import importlib.util
import io
import logging
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from baton.backends.fabric import FabricConfig
from baton.backends.lightning import LightningBackend
from baton.backends.lightning.backend import LightningHookError
from baton.core import Callback, Driver

ROOT = Path(__file__).resolve().parents[3]
STEPS = 24  # 8 batches an epoch: three epochs, two epoch-schedule steps


def recipe_module():
    spec = importlib.util.spec_from_file_location(
        "lightning_module_recipe", ROOT / "recipes" / "lightning_module.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lit = recipe_module()


class Losses(Callback):
    def __init__(self) -> None:
        self.loss: dict[int, float] = {}
        self.logged: dict[int, float] = {}
        self.evals: list[dict[str, float]] = []

    def on_log(self, driver, metrics):
        if "loss" in metrics:
            self.loss[driver.step] = metrics["loss"]
            self.logged[driver.step] = metrics["train_loss"]

    def on_eval_end(self, driver, metrics):
        self.evals.append(metrics)


def trainer_losses(tmp_path: Path) -> list[float]:
    class Record(pl.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.losses.append(outputs["loss"].item())

    pl.seed_everything(0, verbose=False)
    module, data = lit.LitClassifier(), lit.BlobsDataModule()
    record = Record()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        gradient_clip_val=1.0,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[record],
    )
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        trainer.fit(module, datamodule=data)
    return record.losses


def baton_run(run_dir: Path, max_steps: int, callbacks=(), resume: str = "none") -> Losses:
    pl.seed_everything(0, verbose=False)
    backend = LightningBackend(
        lit.LitClassifier(),
        datamodule=lit.BlobsDataModule(),
        config=FabricConfig(accelerator="cpu", grad_clip=1.0),
    )
    losses = Losses()
    Driver(
        backend,
        [losses, *callbacks],
        max_steps=max_steps,
        log_every=1,
        eval_every=STEPS,  # validation draws from the global random state, as Trainer's does
        run_dir=run_dir,
        resume=resume,
    ).fit()
    return losses


def test_losses_equal_trainer_fit_bit_for_bit_and_resume_is_exact(tmp_path):
    expected = trainer_losses(tmp_path / "trainer")
    ours = baton_run(tmp_path / "baton", STEPS)
    assert len(expected) == STEPS
    assert [ours.loss[s] for s in range(1, STEPS + 1)] == expected
    assert ours.logged == ours.loss  # self.log("train_loss") reached baton's log step
    assert set(ours.evals[-1]) == {"val_loss", "val_acc"}  # the names the module logged
    assert 0.0 <= ours.evals[-1]["val_acc"] <= 1.0

    class SaveAt(Callback):
        def on_step_end(self, driver, output):
            if driver.step == 11:  # mid-epoch: the shuffled order must come back
                driver.control.request_save("test", all_ranks=True)

    baton_run(tmp_path / "resume", 11, [SaveAt()])
    resumed = baton_run(tmp_path / "resume", STEPS, resume="auto")
    assert sorted(resumed.loss) == list(range(12, STEPS + 1))
    assert [resumed.loss[s] for s in range(12, STEPS + 1)] == expected[11:]


def test_checkpoint_hooks_are_called(tmp_path):
    class WithHooks(lit.LitClassifier):
        loaded: dict | None = None
        lengths: list[int] = []

        def on_train_start(self):  # the driver's max_steps, given once, reaches the module
            WithHooks.lengths.append(self.trainer.estimated_stepping_batches)

        def on_save_checkpoint(self, checkpoint):
            checkpoint["note"] = {
                "weights_sum": float(sum(p.detach().sum() for p in self.parameters()))
            }

        def on_load_checkpoint(self, checkpoint):
            WithHooks.loaded = checkpoint["note"]

    def backend():
        return LightningBackend(
            WithHooks(), datamodule=lit.BlobsDataModule(), config=FabricConfig(accelerator="cpu")
        )

    driver = Driver(backend(), max_steps=2, run_dir=tmp_path)
    driver.options = driver.options.replace(save_on_stop=True, async_save=True)
    driver.fit()
    # the run's end stopped the checkpoint writer thread (teardown closes the I/O)
    assert not [t for t in threading.enumerate() if t.name.startswith("baton-save")]
    saved = torch.load(tmp_path / "checkpoints" / "step_000002" / "backend" / "state.pt")
    assert "weights_sum" in saved["lightning"]["note"]
    Driver(backend(), max_steps=3, run_dir=tmp_path, resume="auto").fit()
    assert WithHooks.loaded == saved["lightning"]["note"]
    assert WithHooks.lengths == [2, 3]


def test_hooks_baton_cannot_honour_are_listed():
    class Busy(lit.LitClassifier):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            return batch

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            return batch

    with pytest.raises(LightningHookError) as error:
        LightningBackend(Busy(), datamodule=lit.BlobsDataModule())
    message = str(error.value)
    assert "Busy.on_before_batch_transfer" in message
    assert "Busy.transfer_batch_to_device" in message

    class Manual(lit.LitClassifier):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

    backend = LightningBackend(Manual(), config=FabricConfig(accelerator="cpu", grad_accum=2))
    with pytest.raises(ValueError, match="manual optimization"):
        backend.setup()  # as Trainer: manual optimization accumulates in training_step


def test_a_checkpoint_recorded_as_fabric_resumes_when_it_holds_the_loop_state(tmp_path):
    """Checkpoints written before the backend had its own name recorded ``fabric``: one
    that holds the LightningModule loop's state resumes; another backend's name, or a
    Fabric checkpoint without that state, is still refused."""
    import json

    from baton.backends.lightning.backend import holds_loop_state
    from baton.core.errors import UsageError

    def backend():
        return LightningBackend(
            lit.LitClassifier(),
            datamodule=lit.BlobsDataModule(),
            config=FabricConfig(accelerator="cpu"),
        )

    driver = Driver(backend(), max_steps=2, run_dir=tmp_path)
    driver.options = driver.options.replace(save_on_stop=True)
    driver.fit()
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    meta_file = checkpoint / "baton.json"
    meta = json.loads(meta_file.read_text())
    assert meta["backend"]["name"] == "lightning"

    def record_as(name: str) -> None:
        meta["backend"]["name"] = name
        meta_file.write_text(json.dumps(meta))

    record_as("megatron")
    with pytest.raises(UsageError, match="another run \\(backend 'megatron'"):
        Driver(backend(), max_steps=3, run_dir=tmp_path, resume="auto").fit()

    record_as("fabric")  # as an older version wrote it
    steps = Losses()
    Driver(backend(), [steps], max_steps=4, log_every=1, run_dir=tmp_path, resume="auto").fit()
    assert sorted(steps.loss) == [3, 4]  # the loop's position came back with the weights

    plain = tmp_path / "plain"
    plain.mkdir()
    torch.save({"model": {}, "data": {}, "rng": {}}, plain / "state.pt")
    assert holds_loop_state(checkpoint / "backend") and not holds_loop_state(plain)
