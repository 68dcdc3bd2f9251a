"""The ``model_state`` ability on the LightningModule backend: a module holding a
transformers Llama, with AdamW and a per-step schedule from ``configure_optimizers``;
gradient norms before clipping against transformers' own, freezing and a learning rate
set by a callback (the schedule continues from it)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from baton.backends.fabric import FabricConfig
from baton.backends.lightning import LightningBackend
from baton.core import Driver
from support.model_state_probe import FROZEN, ModelStateProbe, check_probe, transformers_grad_norms
from support.tiny_llama import save_tiny_llama


class LlamaModule(pl.LightningModule):
    def __init__(self, source: Path) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.llama = AutoModelForCausalLM.from_pretrained(source)

    def training_step(self, batch, batch_idx):
        return self.llama(**batch).loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self):
        tokens = torch.randint(0, 256, (32, 33), generator=torch.Generator().manual_seed(5))
        return DataLoader([{"input_ids": t, "labels": t} for t in tokens], batch_size=4)


def test_lightning_gradients_freeze_and_lr(tmp_path: Path):
    source = save_tiny_llama(tmp_path / "tiny-llama")
    module = LlamaModule(source)
    backend = LightningBackend(module, config=FabricConfig(grad_clip=0.01, accelerator="cpu"))
    probe = ModelStateProbe(FROZEN, prefix="llama.")
    Driver(backend, [probe], max_steps=4, log_every=1, run_dir=tmp_path / "run").fit()
    first = next(iter(module.train_dataloader()))
    check_probe(probe, transformers_grad_norms(source, [first]))
    assert backend.loop.scheduler_configs[0].scheduler.base_lrs == [pytest.approx(5e-4)]
