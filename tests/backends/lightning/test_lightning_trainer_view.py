"""What a LightningModule reads on ``self.trainer`` under baton equals what Trainer.fit shows
it at the same points; anything else fails naming the attribute."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lightning_corpus as corpus

READ = (
    "estimated_stepping_batches",
    "max_steps",
    "max_epochs",
    "current_epoch",
    "global_step",
    "is_global_zero",
    "world_size",
    "num_devices",
    "sanity_checking",
    "training",
    "validating",
)


def snapshot(trainer) -> dict:
    seen = {name: getattr(trainer, name) for name in READ}
    seen["datamodule"] = type(trainer.datamodule).__name__
    seen["optimizers"] = [type(o).__name__ for o in trainer.optimizers]
    seen["schedulers"] = [(c.interval, c.frequency) for c in trainer.lr_scheduler_configs]
    seen["callback_metrics"] = sorted(trainer.callback_metrics)
    return seen


class Reading(corpus.TinyLM):
    """The LM of the corpus, reading the trainer where modules usually do."""

    seen: list[tuple[str, dict]]

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx in (0, 9):
            self.seen.append(("train_batch_end", snapshot(self.trainer)))

    def on_validation_epoch_end(self):
        self.seen.append(("validation_epoch_end", snapshot(self.trainer)))

    def on_train_epoch_end(self):
        self.seen.append(("train_epoch_end", snapshot(self.trainer)))


def test_trainer_attributes_equal_trainer_fit(tmp_path, monkeypatch):
    monkeypatch.setitem(corpus.CASES, "reading", corpus.CASES["lm"])
    monkeypatch.setattr(corpus.CASES["reading"], "module", Reading)
    monkeypatch.setattr(corpus.CASES["reading"], "steps", 12)
    monkeypatch.setitem(corpus.CASES["reading"].trainer, "max_epochs", 3)
    monkeypatch.setitem(corpus.CASES["reading"].backend, "max_epochs", 3)
    Reading.seen = []
    corpus.trainer_fit("reading", tmp_path / "trainer")
    expected, Reading.seen = Reading.seen, []
    corpus.baton_fit("reading", tmp_path / "baton")
    assert len(expected) > 10
    assert Reading.seen == expected


def test_manual_optimization_counts_each_optimizer_step(tmp_path):
    steps: list[int] = []

    class Counting(corpus.GAN):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            steps.append(self.trainer.global_step)

    corpus.CASES["counting"] = corpus.Case(Counting, corpus.BlobsData, 3, eval_every=3)
    try:
        corpus.baton_fit("counting", tmp_path)
    finally:
        del corpus.CASES["counting"]
    assert steps == [2, 4, 6]


def test_an_attribute_baton_does_not_provide_is_named(tmp_path):
    class Curious(corpus.PlateauClassifier):
        def on_train_start(self):
            self.trainer.fit_loop  # noqa: B018

    corpus.CASES["curious"] = corpus.Case(Curious, corpus.BlobsData, 2)
    try:
        with pytest.raises(AttributeError, match=r"self\.trainer\.fit_loop is not available"):
            corpus.baton_fit("curious", tmp_path)
    finally:
        del corpus.CASES["curious"]
