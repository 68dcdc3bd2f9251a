"""LightningModules written the way Lightning's documentation writes them, each with the
``Trainer`` settings it is fitted with and the equivalent baton run.

Run as a script (``python lightning_corpus.py CASE RUN_DIR MAX_STEPS OUT.json``) it
resumes a baton run in a fresh process and writes what it recorded.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from baton.backends.fabric import FabricConfig
from baton.backends.lightning import LightningBackend
from baton.core import Callback, Driver


# -- data ------------------------------------------------------------------------------
class BlobsData(pl.LightningDataModule):
    """Gaussian blobs; 232 training samples in batches of 32: 8 batches, the last of 8."""

    def __init__(self, train: int = 232, val: int = 72, batch_size: int = 32) -> None:
        super().__init__()
        self.train, self.val, self.batch_size = train, val, batch_size

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(7)
        centers = 2 * torch.randn(4, 16, generator=g)
        y = torch.randint(0, 4, (self.train + self.val,), generator=g)
        x = centers[y] + 3.0 * torch.randn(self.train + self.val, 16, generator=g)
        self.train_set = TensorDataset(x[: self.train], y[: self.train])
        self.val_set = TensorDataset(x[self.train :], y[self.train :])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


class TokensData(pl.LightningDataModule):
    """Random token sequences: 10 training batches of 4 (an epoch is not a multiple of 3)."""

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, 50, (52, 17), generator=g)
        self.train_set, self.val_set = tokens[:40], tokens[40:]

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=4, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=5)


# -- modules ---------------------------------------------------------------------------
class BatchNormClassifier(pl.LightningModule):
    """BatchNorm, dropout; validation outputs aggregated in ``on_validation_epoch_end``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4)
        )
        self.validation_step_outputs: list[torch.Tensor] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.validation_step_outputs.append((logits.argmax(dim=1) == y).float())

    def on_validation_epoch_end(self):
        self.log("val_acc", torch.cat(self.validation_step_outputs).mean())
        self.validation_step_outputs.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class TinyLM(pl.LightningModule):
    """A next-token model; OneCycleLR sized from ``estimated_stepping_batches``."""

    def __init__(self, vocab: int = 50, width: int = 24) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(width, vocab)

    def loss(self, tokens):
        logits = self.head(self.drop(self.embed(tokens[:, :-1])))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=3e-2, total_steps=self.trainer.estimated_stepping_batches
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class PlateauClassifier(pl.LightningModule):
    """``ReduceLROnPlateau`` on ``val_loss``, checked every epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.05)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=0.5, patience=0, threshold=0.05
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"},
        }


class ClippedClassifier(pl.LightningModule):
    """Own gradient clipping (by value, first layer only) and a gradient norm logged in
    ``on_before_optimizer_step``; validation every 5 batches, not at epoch ends."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(16, 32)
        self.rest = nn.Sequential(nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.rest(self.first(x)), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.rest(self.first(x)), y))

    def on_before_optimizer_step(self, optimizer):
        norms = [p.grad.norm() for p in self.parameters() if p.grad is not None]
        self.log("grad_l2", torch.stack(norms).norm())

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ):
        torch.nn.utils.clip_grad_value_(self.first.parameters(), 0.05)
        self.clip_gradients(
            optimizer,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
        )

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.2)
        decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return [optimizer], [{"scheduler": decay, "interval": "step", "frequency": 4}]


class GAN(pl.LightningModule):
    """Lightning's documented GAN step: manual optimization, two optimizers, noise drawn
    from the global random state in training and in validation."""

    def __init__(self, latent: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, 16))
        self.discriminator = nn.Sequential(
            nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Dropout(0.2), nn.Linear(32, 1)
        )

    def adversarial_loss(self, logits, real: bool):
        target = torch.ones_like(logits) if real else torch.zeros_like(logits)
        return F.binary_cross_entropy_with_logits(logits, target)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(x.size(0), self.hparams.latent, device=self.device)

        self.toggle_optimizer(opt_g)
        g_loss = self.adversarial_loss(self.discriminator(self.generator(z)), real=True)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        real = self.adversarial_loss(self.discriminator(x), real=True)
        fake = self.adversarial_loss(self.discriminator(self.generator(z).detach()), real=False)
        d_loss = (real + fake) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        return d_loss

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        z = torch.randn(x.size(0), self.hparams.latent, device=self.device)
        fake = self.adversarial_loss(self.discriminator(self.generator(z)), real=False)
        real = self.adversarial_loss(self.discriminator(x), real=True)
        self.log("val_loss", (real + fake) / 2)

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999))
        return [opt_g, opt_d]


class SyncLogged(pl.LightningModule):
    """Values averaged over ranks with ``self.log(..., sync_dist=True)``, per step and epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        accuracy = (logits.argmax(dim=1) == y).float().mean()
        self.log("val_acc", accuracy, on_epoch=True, sync_dist=True, reduce_fx="mean")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class SmallBatchBlobs(BlobsData):
    """Batches of 16: each of 2 ranks reads 116 samples, 8 batches an epoch."""

    def __init__(self) -> None:
        super().__init__(batch_size=16)


# -- the cases: Trainer settings and the equivalent baton run ----------------------------
@dataclass
class Case:
    module: type
    data: type
    steps: int
    #: Trainer(...) settings beyond the common ones
    trainer: dict[str, Any] = field(default_factory=dict)
    #: FabricConfig fields
    fabric: dict[str, Any] = field(default_factory=dict)
    #: LightningBackend keyword arguments
    backend: dict[str, Any] = field(default_factory=dict)
    eval_every: int = 8


CASES = {
    "batchnorm": Case(BatchNormClassifier, BlobsData, 32, trainer={"max_epochs": 4}),
    "lm": Case(
        TinyLM,
        TokensData,
        32,  # 10 batches an epoch, windows of 3: 4 optimizer steps an epoch
        trainer={"max_epochs": 8, "accumulate_grad_batches": 3},
        fabric={"grad_accum": 3},
        backend={"max_epochs": 8},
        eval_every=4,
    ),
    "ddp": Case(
        SyncLogged,
        SmallBatchBlobs,
        32,
        trainer={"max_epochs": 4, "devices": 2, "strategy": "ddp"},
        backend={"max_epochs": 4},
    ),
    "gan": Case(
        GAN,
        BlobsData,
        32,  # two optimizer steps a batch: Trainer's global_step is 64
        trainer={"max_steps": 64},
        backend={"max_epochs": 4},
    ),
    "plateau": Case(PlateauClassifier, BlobsData, 40, trainer={"max_epochs": 5}),
    "clipping": Case(
        ClippedClassifier,
        BlobsData,
        35,
        trainer={
            "max_steps": 35,
            "gradient_clip_val": 0.5,
            "val_check_interval": 5,
            "check_val_every_n_epoch": None,
        },
        fabric={"grad_clip": 0.5},  # the driver's max_steps is the Trainer's
        eval_every=5,
    ),
}


class Record(pl.Callback):
    """What a run produced: each batch's (normalized) loss, each validation's metrics."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.validations: list[dict[str, float]] = []
        self.lrs: list[float] = []
        self.epochs: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_epoch_end(self, trainer, pl_module):
        metrics = trainer.callback_metrics
        self.epochs.append({k: float(v) for k, v in metrics.items() if k.endswith("_epoch")})

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            metrics = trainer.callback_metrics
            self.validations.append(
                {k: float(v) for k, v in metrics.items() if k.startswith("val")}
            )


def trainer_fit(name: str, root: Path) -> Record:
    case = CASES[name]
    pl.seed_everything(0, verbose=False)
    record = Record()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": root,
        "callbacks": [record],
    }
    trainer = pl.Trainer(**{**settings, **case.trainer})
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        trainer.fit(case.module(), datamodule=case.data())
    return record


class Seen(Callback):
    """What baton's driver saw: step losses, log metrics, evaluation metrics."""

    def __init__(self) -> None:
        self.loss: dict[int, float] = {}
        self.logged: dict[int, dict[str, float]] = {}
        self.evals: dict[int, dict[str, float]] = {}

    def on_log(self, driver, metrics):
        self.loss[driver.step] = metrics["loss"]
        self.logged[driver.step] = dict(metrics)

    def on_eval_end(self, driver, metrics):
        self.evals[driver.step] = dict(metrics)


class SaveAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, driver, output):
        if driver.step == self.step:
            driver.control.request_save("test", all_ranks=True)


def baton_fit(
    name: str,
    run_dir: Path,
    max_steps: int | None = None,
    *,
    save_at: int | None = None,
    resume: str = "none",
) -> tuple[Record, Seen]:
    case = CASES[name]
    pl.seed_everything(0, verbose=False)
    record, seen = Record(), Seen()
    backend = LightningBackend(
        case.module(),
        datamodule=case.data(),
        config=FabricConfig(accelerator="cpu", **case.fabric),
        callbacks=[record],
        **case.backend,
    )
    callbacks: list[Callback] = [seen]
    if save_at is not None:
        callbacks.append(SaveAt(save_at))
    Driver(
        backend,
        callbacks,
        max_steps=max_steps or case.steps,
        log_every=1,
        eval_every=case.eval_every,
        run_dir=run_dir,
        resume=resume,
    ).fit()
    return record, seen


def main() -> None:
    name, run_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    record, seen = baton_fit(name, run_dir, resume="auto")
    out.write_text(
        json.dumps(
            {
                "losses": record.losses,
                "validations": record.validations,
                "evals": {str(k): v for k, v in seen.evals.items()},
                "steps": sorted(seen.loss),
            }
        )
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
