"""Save, resume, corruption handling and mismatch errors with the driver's checkpoint layout."""

from __future__ import annotations

import json

import pytest

from baton.core import LOAD_ALL, Callback, CheckpointError, CheckpointFacts, Driver, LoadPlan
from baton.core.checkpoints.files import CheckpointMismatch
from support.scalar_backend import ScalarBackend


class Losses(Callback):
    state_key = "losses"

    def __init__(self) -> None:
        self.values: list[float] = []
        self.restored: dict | None = None

    def on_log(self, driver, metrics):
        self.values.append(metrics["loss"])

    def state_dict(self):
        return {"count": len(self.values)}

    def load_state_dict(self, state):
        self.restored = state


class SaveEvery(Callback):
    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, driver, output):
        if driver.step % self.every == 0:
            driver.control.request_save("schedule", all_ranks=True)


def run(tmp_path, steps, resume="none", every=3, lr=0.1):
    losses = Losses()
    driver = Driver(
        ScalarBackend(lr=lr),
        [losses, SaveEvery(every)],
        max_steps=steps,
        log_every=1,
        run_dir=tmp_path,
        resume=resume,
    )
    result = driver.fit()
    return losses, result


def test_resume_continues_exactly(tmp_path):
    full, _ = run(tmp_path / "a", 10)
    first, _ = run(tmp_path / "b", 6)
    second, result = run(tmp_path / "b", 10, resume="auto")
    assert result.resumed_from == tmp_path / "b" / "checkpoints" / "step_000006"
    assert second.restored == {"count": 6}
    assert first.values + second.values == full.values


def test_truncated_checkpoint_is_skipped_with_warning(tmp_path, caplog):
    run(tmp_path, 6)
    newest = tmp_path / "checkpoints" / "step_000006" / "backend" / "state.json"
    newest.write_text(newest.read_text()[:5])
    with caplog.at_level("WARNING", logger="baton"):
        _, result = run(tmp_path, 8, resume="auto")
    assert result.resumed_from.name == "step_000003"
    assert "truncated" in caplog.text


def test_half_written_checkpoint_is_never_loaded(tmp_path):
    run(tmp_path, 3)
    (tmp_path / "checkpoints" / "step_000006" / "backend").mkdir(parents=True)  # no baton.json
    _, result = run(tmp_path, 4, resume="auto")
    assert result.resumed_from.name == "step_000003"


def test_checkpoint_from_different_setup_fails_clearly(tmp_path):
    run(tmp_path, 3)
    with pytest.raises(CheckpointError, match="lr: checkpoint has 0.1, this run has 0.5"):
        run(tmp_path, 6, resume="auto", lr=0.5)


def test_explicit_path_to_a_broken_checkpoint_raises(tmp_path):
    run(tmp_path, 3)
    (tmp_path / "checkpoints" / "step_000003" / "baton.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        run(tmp_path, 6, resume=str(tmp_path / "checkpoints" / "step_000003"))


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path):
    _, result = run(tmp_path, 3, resume="auto")
    assert result.resumed_from is None and result.step == 3
    meta = json.loads((tmp_path / "checkpoints" / "latest" / "baton.json").read_text())
    assert meta["versions"]["scalar"] == "1.0"
    assert meta["callbacks"]["losses"] == {"count": 3}
    assert meta["backend"] == {"name": "scalar", "version": "1.0", "world_size": 1, "lr": 0.1}


def test_ranks_compare_the_checkpoint_they_planned_with_one_or_reduction():
    from baton.core.checkpoints.resuming import same_on_every_rank

    def ranks(*values: int) -> list[bool]:
        """Each rank's answer when ``values`` are the ranks' own (flags OR-reduced)."""
        flags: list[list[bool]] = []
        for value in values:
            same_on_every_rank(value, lambda mine: flags.append(mine) or mine)
        reduced = [any(column) for column in zip(*flags, strict=True)]
        return [same_on_every_rank(v, lambda _mine: reduced) for v in values]

    assert ranks(11, 11, 11) == [True, True, True]
    assert ranks(0, 0) == [True, True]
    assert ranks(11, 6) == [False, False]  # step 10 on one rank, 5 on the other
    assert ranks(0, 1) == [False, False]  # a fresh start beside a checkpoint
    assert ranks(2**40 + 1, 1) == [False, False]
    with pytest.raises(ValueError, match="outside"):
        same_on_every_rank(-1, lambda flags: flags)


class ShardedScalar(ScalarBackend):
    """The scalar backend as if sharded: its layout, samples and data are recorded by
    core; a change of ``tp`` is refused, of ``dp`` resharded."""

    def __init__(self, tp: int = 1, dp: int = 1, data: str = "abc") -> None:
        super().__init__()
        self.layout, self.data = {"tp": tp, "dp": dp}, data
        self.loaded = 0
        self.asked: list[dict] = []

    def checkpoint_facts(self) -> CheckpointFacts:
        return CheckpointFacts(self.layout, samples=2 * len(self.events), data=self.data)

    def plan_load(self, saved_layout):
        self.asked.append(dict(saved_layout))
        if saved_layout["tp"] != self.layout["tp"]:
            return LoadPlan(refusal="tensor shards do not reshard here; resume with the saved tp")
        return LOAD_ALL

    def legacy_facts(self, directory):
        side = directory / "layout.json"
        return CheckpointFacts(json.loads(side.read_text())) if side.is_file() else None

    def load(self, directory, plan=LOAD_ALL):
        self.loaded += 1
        super().load(directory, plan)


def fit(tmp_path, backend, steps, resume="none"):
    driver = Driver(backend, [SaveEvery(3)], max_steps=steps, run_dir=tmp_path, resume=resume)
    return driver.fit()


def test_core_records_the_facts_and_refuses_a_mismatch_before_loading(tmp_path):
    fit(tmp_path, ShardedScalar(tp=2), 3)
    meta = json.loads((tmp_path / "checkpoints" / "latest" / "baton.json").read_text())
    assert meta["checkpoint"] == {"layout": {"tp": 2, "dp": 1}, "samples": 2, "data": "abc"}

    refused = ShardedScalar(tp=1, data="xyz")
    with pytest.raises(CheckpointMismatch) as raised:
        fit(tmp_path, refused, 6, resume="auto")
    message = str(raised.value)
    assert "layout: checkpoint has tp=2, dp=1; this run has tp=1, dp=1: tensor shards" in message
    assert "data: checkpoint has fingerprint abc; this run has xyz" in message
    assert refused.loaded == 0

    resharded = ShardedScalar(tp=2, dp=4)  # the backend reshards data parallel
    assert fit(tmp_path, resharded, 6, resume="auto").resumed_from is not None
    assert resharded.asked == [{"tp": 2, "dp": 1}] and resharded.loaded == 1


def test_a_checkpoint_with_the_facts_in_a_side_file_is_checked_too(tmp_path):
    fit(tmp_path, ShardedScalar(tp=2), 3)
    checkpoint = tmp_path / "checkpoints" / "step_000003"
    meta = json.loads((checkpoint / "baton.json").read_text())
    del meta["checkpoint"]  # as written before baton.json recorded them
    (checkpoint / "baton.json").write_text(json.dumps(meta))
    (checkpoint / "backend" / "layout.json").write_text(json.dumps({"tp": 2, "dp": 1}))
    with pytest.raises(CheckpointMismatch, match="checkpoint has tp=2, dp=1; this run has tp=1"):
        fit(tmp_path, ShardedScalar(tp=1), 6, resume="auto")
    assert fit(tmp_path, ShardedScalar(tp=2), 6, resume="auto").resumed_from == checkpoint


def test_a_checkpoint_knows_its_run_directory_only_inside_one(tmp_path):
    from baton.core.checkpoints.files import checkpoints_dir, run_dir_of
    from baton.core.cli.command import checkpoint_run_dir

    run = tmp_path / "runs" / "a"
    inside = checkpoints_dir(run) / "step_000010"
    assert run_dir_of(inside) == run
    assert checkpoint_run_dir(inside) == run
    elsewhere = tmp_path / "downloads" / "step_000010"
    assert run_dir_of(elsewhere) is None
    assert checkpoint_run_dir(elsewhere) == tmp_path / "downloads"
