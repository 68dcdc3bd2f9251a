"""The host-sync counter finds a sync a callback forces, and none from the driver alone."""

import io

import pytest
from rich.console import Console

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.callbacks import Progress
from baton.core import Callback, Driver
from benchmarks.host_syncs import count_host_syncs


class ReadsLossEveryStep(Callback):
    """The mistake the benchmark exists to catch: a host read on every step."""

    def on_step_end(self, driver, output) -> None:
        float(output.loss)


def tiny_driver(tmp_path, callbacks) -> Driver:
    config = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=16),
        batch_size=2,
        warmup_steps=2,
        accelerator="cpu",
    )
    return Driver(config.backend(), callbacks, max_steps=12, log_every=5, run_dir=tmp_path)


@pytest.mark.parametrize("bad", [False, True])
def test_driver_syncs_on_non_log_steps(tmp_path, bad: bool) -> None:
    callbacks = [Progress(console=Console(file=io.StringIO()))]
    if bad:
        callbacks.append(ReadsLossEveryStep())
    report = count_host_syncs(tiny_driver(tmp_path, callbacks))
    assert report.log_steps == {5, 10, 12}
    assert report.non_log_steps == 9
    found = report.outside_backend(non_log_only=True)
    assert found == (9 if bad else 0), report.what("driver", non_log_only=True)
    assert report.count("fetch", non_log_only=False) > 0  # the one transfer per log step
