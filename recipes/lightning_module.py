"""An existing LightningModule and LightningDataModule, unchanged, trained by baton.

uv run baton run recipes/lightning_module.py --max-steps 200
uv run baton eval recipes/lightning_module.py --checkpoint runs/lightning_module/checkpoints/latest

``LitClassifier`` and ``BlobsDataModule`` are written as Lightning's documentation writes
them (they also run under ``lightning.pytorch.Trainer.fit`` as they are); baton calls
their hooks through ``LightningBackend`` and adds its own callbacks and checkpoints.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

from baton.backends.fabric import FabricConfig
from baton.backends.lightning import LightningBackend
from baton.callbacks import Checkpoint, CompositeLogger, Progress
from baton.callbacks.sinks.console import ConsoleSink
from baton.core import Driver


class LitClassifier(pl.LightningModule):
    """A small MLP classifier."""

    def __init__(self, features: int = 16, classes: int = 4, hidden: int = 64, lr: float = 1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        step_decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.97)
        epoch_decay = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
        return [optimizer], [
            {"scheduler": step_decay, "interval": "step", "frequency": 3},
            {"scheduler": epoch_decay, "interval": "epoch"},
        ]


class BlobsDataModule(pl.LightningDataModule):
    """Gaussian blobs, one per class, split into train and validation sets."""

    def __init__(
        self, samples: int = 320, features: int = 16, classes: int = 4, batch_size: int = 32
    ):
        super().__init__()
        self.samples, self.features, self.classes = samples, features, classes
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(1234)
        centers = 2 * torch.randn(self.classes, self.features, generator=g)
        y = torch.randint(0, self.classes, (self.samples,), generator=g)
        x = centers[y] + torch.randn(self.samples, self.features, generator=g)
        self.train_set, self.val_set = random_split(
            TensorDataset(x, y), [0.8, 0.2], generator=torch.Generator().manual_seed(0)
        )

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


def recipe(
    max_steps: int = 200,
    lr: float = 1e-2,
    batch_size: int = 32,
    grad_clip: float = 1.0,
    seed: int = 0,
    log_every: int = 20,
    eval_every: int = 100,
    run_dir: str = "runs/lightning_module",
    progress: bool = True,
) -> Driver:
    """Train LitClassifier on BlobsDataModule through baton.

    Args:
        max_steps: optimizer steps to train.
        lr: AdamW learning rate (the module's schedulers decay it).
        batch_size: samples per batch.
        grad_clip: gradient norm clipping threshold (0: no clipping).
        seed: seed of the weights and of the data order (pl.seed_everything).
        log_every: steps between log lines.
        eval_every: steps between evaluations, and between checkpoints (0: none).
        run_dir: where checkpoints and logs go.
        progress: show the progress bar.
    """
    pl.seed_everything(seed, verbose=False)
    backend = LightningBackend(
        LitClassifier(lr=lr),
        datamodule=BlobsDataModule(batch_size=batch_size),
        config=FabricConfig(accelerator="cpu", grad_clip=grad_clip or None),
    )
    keys = ["loss", "train_loss", "eval/val_loss", "eval/val_acc", "lr"]
    return Driver(
        backend,
        [
            Checkpoint(every_n_steps=eval_every or None, keep_last=2),
            CompositeLogger(["jsonl", ConsoleSink(keys)]),
            *([Progress()] if progress else []),
        ],
        max_steps=max_steps,
        log_every=log_every,
        eval_every=eval_every,
        run_dir=run_dir,
    )
