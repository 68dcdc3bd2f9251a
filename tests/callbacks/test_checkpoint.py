"""Checkpoint rotation, best-k, resume and corrupt checkpoints, in this process (Fabric, CPU)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from baton.backends.fabric.models.gpt import GPT, GPTConfig
from baton.callbacks import Checkpoint
from baton.core import Callback, CheckpointError
from baton.core.checkpoints import files as ckpt

from .conftest import assert_bitwise_equal, fit_in_process, load_state, tiny_driver


def names(run_dir: Path) -> list[int]:
    return [ckpt.checkpoint_step(p) or 0 for p in ckpt.list_checkpoints(run_dir / "checkpoints")]


class FakeScore(Callback):
    """Logs a made-up ``score`` metric per step, to test best-k selection."""

    def __init__(self, scores: dict[int, float]) -> None:
        self.scores = scores

    def on_log(self, driver, metrics):
        if driver.step in self.scores:
            metrics["score"] = self.scores[driver.step]


def test_keep_last_and_best_survive_resume(tmp_path: Path) -> None:
    scores = {4: 5.0, 8: 1.0, 12: 3.0, 16: 4.0, 20: 6.0, 24: 7.0}
    cb = Checkpoint(every_n_steps=4, keep_last=2, keep_best=1, monitor="score")
    tiny_driver(tmp_path, [cb, FakeScore(scores)], max_steps=12, log_every=4).fit()
    assert names(tmp_path) == [8, 12]  # the best (8) is also among the last two
    assert cb.scores == {"step_000008": 1.0, "step_000012": 3.0}

    cb2 = Checkpoint(every_n_steps=4, keep_last=2, keep_best=1, monitor="score")
    driver = tiny_driver(tmp_path, [cb2, FakeScore(scores)], max_steps=24, log_every=4)
    driver.options = driver.options.replace(resume="auto")
    driver.fit()
    # the best (8, score 1.0, from before the resume) survives rotation; last two kept
    assert names(tmp_path) == [8, 20, 24]
    assert cb2.kept == ["step_000008", "step_000020", "step_000024"]
    meta = ckpt.read_meta(tmp_path / "checkpoints" / "step_000024")
    assert meta["checkpoint_score"] == {"score": 7.0}
    assert meta["callbacks"]["checkpoint"]["kept"][-1] == "step_000024"


def test_truncated_checkpoint_is_skipped_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fit_in_process(tmp_path, "--max-steps", "10", "--keep-last", "3")
    newest = tmp_path / "checkpoints" / "step_000010" / "backend" / "state.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    caplog.set_level(logging.INFO, logger="baton")
    driver = fit_in_process(
        tmp_path, "--max-steps", "12", "--resume", "auto", "--allow-changed", "max_steps"
    )
    assert "truncated" in caplog.text and "skipping checkpoint" in caplog.text
    assert driver.resumed_from == tmp_path / "checkpoints" / "step_000005"
    # the truncated step 10 was written anew; rotation (keep 2) then dropped step 5
    assert names(tmp_path) == [10, 12] and driver.step == 12
    ckpt.read_meta(tmp_path / "checkpoints" / "step_000010")


def test_failed_save_never_leaves_fewer_than_one_complete(tmp_path: Path) -> None:
    # saves every 5 steps keeping 1; the save of step 15 dies part-way (a write error)
    with pytest.raises(OSError, match="simulated"):
        fit_in_process(tmp_path, "--max-steps", "30", "--keep-last", "1", "--fail-save-at", "15")
    root = tmp_path / "checkpoints"
    assert names(tmp_path) == [10]
    assert ckpt.latest(root) == (root / "step_000010").resolve()
    ckpt.read_meta(root / "step_000010")  # complete: manifest matches
    assert not any(p.name.startswith(ckpt.TMP_PREFIX) for p in root.iterdir())
    # and the run resumes from it
    driver = fit_in_process(
        tmp_path,
        "--max-steps",
        "20",
        "--keep-last",
        "1",
        "--resume",
        "auto",
        "--allow-changed",
        "max_steps",
    )
    assert driver.resumed_from == root / "step_000010" and names(tmp_path) == [20]


def test_async_save_matches_sync_and_overlaps(tmp_path: Path) -> None:
    sync = fit_in_process(tmp_path / "sync", "--max-steps", "10")
    fit_in_process(tmp_path / "async", "--max-steps", "10", "--async-save")
    assert "async_save" in sync.backend.abilities().names
    for step in (5, 10):
        name = ckpt.checkpoint_name(step)
        a = load_state(tmp_path / "sync" / "checkpoints" / name)
        b = load_state(tmp_path / "async" / "checkpoints" / name)
        assert_bitwise_equal(a, b, name)


def test_wait_for_saves_completes_an_async_save_in_flight(tmp_path: Path) -> None:
    """``Driver.wait_for_saves`` returns once the asynchronous save is final: renamed,
    ``latest`` updated and ``on_checkpoint_saved`` called."""
    seen: dict[str, object] = {}

    class SaveThenWait(Callback):
        def on_step_end(self, driver, output) -> None:
            if driver.step == 3:
                driver.save_checkpoint("test")
                seen["in flight"] = not driver.saved
                driver.wait_for_saves()
                seen["saved"] = [p.name for p in driver.saved]
                seen["latest"] = ckpt.latest(driver.checkpoint_dir)

    driver = tiny_driver(tmp_path, [SaveThenWait()], max_steps=4)
    driver.options = driver.options.replace(async_save=True)
    driver.fit()
    final = tmp_path / "checkpoints" / "step_000003"
    assert seen == {"in flight": True, "saved": ["step_000003"], "latest": final.resolve()}
    ckpt.read_meta(final)  # complete: its manifest matches


def test_resume_with_a_different_model_fails_clearly(tmp_path: Path) -> None:
    tiny_driver(tmp_path, [Checkpoint(every_n_steps=5)], max_steps=5).fit()
    driver = tiny_driver(tmp_path, [Checkpoint()], max_steps=10, resume="auto")
    wider = GPTConfig(n_layer=1, d_model=64, n_head=2, seq_len=32)
    driver.backend.model_source = lambda: GPT(wider)
    with pytest.raises(CheckpointError, match="different setup"):
        driver.fit()


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="monitor"):
        Checkpoint(keep_best=1)
    with pytest.raises(ValueError, match="keep_last"):
        Checkpoint(keep_last=0)
