"""A monitored key without ``eval/`` where evaluation keeps its author's names
(a LightningModule's ``val_loss``): read in the phase that carries it."""

from __future__ import annotations

import pytest

from baton.callbacks.metric_keys import Monitored
from baton.core.metrics import NamedMetrics, evaluation_keys


def test_a_named_evaluation_key_is_read_at_evaluation() -> None:
    watched = Monitored("val_loss", owner="EarlyStopping")
    assert watched.read("train", 1, {"loss": 2.0}, named_eval=True) is None
    assert watched.read("eval", 2, {"val_loss": 1.5}, named_eval=True) == 1.5
    assert watched.phase == "eval"
    assert watched.read("train", 3, {"loss": 1.9, "val_loss": 9.0}, named_eval=True) is None


def test_a_training_key_stays_a_training_key() -> None:
    watched = Monitored("loss", owner="Checkpoint")
    assert watched.read("train", 1, {"loss": 2.0}, named_eval=True) == 2.0
    assert watched.read("eval", 2, {"loss": 1.0}, named_eval=True) is None


def test_a_key_in_neither_phase_fails_at_the_first_evaluation_naming_both() -> None:
    watched = Monitored("val_los", owner="EarlyStopping")
    assert watched.read("train", 1, {"loss": 2.0}, named_eval=True) is None
    with pytest.raises(ValueError, match=r"they are: val_acc, val_loss \(nor among the training"):
        watched.read("eval", 2, {"val_loss": 1.5, "val_acc": 0.5}, named_eval=True)


def test_without_named_evaluation_a_missing_key_fails_at_the_first_training_metrics() -> None:
    with pytest.raises(ValueError, match="training metrics of step 1"):
        Monitored("val_loss", owner="EarlyStopping").read("train", 1, {"loss": 2.0})


def test_the_driver_keeps_named_metrics_and_prefixes_a_backends_own_keys() -> None:
    assert evaluation_keys({"loss": 1.0, "eval/ppl": 2.0}) == {"eval/loss": 1.0, "eval/ppl": 2.0}
    assert evaluation_keys(NamedMetrics(val_loss=1.0, loss=2.0)) == {"val_loss": 1.0, "loss": 2.0}
