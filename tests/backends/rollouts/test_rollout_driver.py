"""The driver with a rollout phase: the phase runs between on_step_start and the step,
on_rollout_end sees every new completion, the rollout file holds what the hook saw, the
metrics reach the log with the step's own seconds, the phase's state travels in each
checkpoint (under the manifest), a resumed run's rollouts are bit for bit the
uninterrupted run's, and a callback can stop the run from on_rollout_end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.callbacks import Checkpoint, RolloutRecords
from baton.callbacks.rollout_records import read_rollouts
from baton.core import HOOKS, Callback, Driver
from baton.core.checkpoints.files import CheckpointError, CheckpointMismatch, read_meta
from support.posttrain import LoggedMetrics
from support.rollouts import WeightSource, make_phase, rollout_files
from support.scalar_backend import ScalarBackend


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return rollout_files(tmp_path_factory.mktemp("rollouts"))


class HookLog(Callback):
    """Every hook in order; the records each on_rollout_end saw."""

    def __init__(self) -> None:
        self.hooks: list[tuple[int, str]] = []
        self.seen: list[dict] = []

    def on_rollout_end(self, driver, rollouts):
        self.hooks.append((driver.step, "on_rollout_end"))
        self.seen.extend(record.to_json() for record in rollouts)


for _hook in HOOKS:
    if _hook != "on_rollout_end":
        setattr(
            HookLog, _hook, (lambda h: lambda self, d, *a: self.hooks.append((d.step, h)))(_hook)
        )


def run(files, run_dir: Path, steps: int, *, resume="none", save_every=None, extra=()):
    """A ScalarBackend run whose rollouts come from a tiny Llama; the weights the phase
    gathers depend on the backend's trained value ``w``, as a policy's would."""
    backend = ScalarBackend()
    weights = WeightSource(files["policy"], scale_of=lambda: backend.w)
    phase = make_phase(files, rows_per_step=8, num_generations=4, num_iterations=2, weights=weights)
    logged, hooks = LoggedMetrics(), HookLog()
    callbacks = [logged, hooks, RolloutRecords(), *extra]
    if save_every:
        callbacks.append(Checkpoint(every_n_steps=save_every, save_on_stop=False, keep_last=None))
    driver = Driver(
        backend,
        callbacks,
        rollouts=phase,
        max_steps=steps,
        log_every=1,
        run_dir=run_dir,
        resume=resume,
    )
    result = driver.fit()
    return result, logged, hooks, backend, phase


def test_rollouts_run_before_the_step_and_reach_hooks_file_log_and_checkpoint(files, tmp_path):
    result, logged, hooks, _, phase = run(files, tmp_path, 4, save_every=2)
    assert result.step == 4
    step_hooks = [
        (s, h) for s, h in hooks.hooks if h in ("on_step_start", "on_rollout_end", "on_step_end")
    ]
    assert step_hooks == [
        (0, "on_step_start"), (0, "on_rollout_end"), (1, "on_step_end"),
        (1, "on_step_start"), (2, "on_step_end"),  # step 2 trains on step 1's rollouts again
        (2, "on_step_start"), (2, "on_rollout_end"), (3, "on_step_end"),
        (3, "on_step_start"), (4, "on_step_end"),
    ]  # fmt: skip
    # on_rollout_end saw every completion; the file holds exactly those records
    assert len(hooks.seen) == 16 and [r["step"] for r in hooks.seen] == [1] * 8 + [3] * 8
    assert read_rollouts(tmp_path / "logs" / "rollouts.jsonl") == hooks.seen
    record = hooks.seen[0]
    assert set(record) >= {
        "prompt_ids", "completion_ids", "completion", "rewards", "advantage", "logp_sum",
    }  # fmt: skip
    assert set(record["rewards"]) == {"length", "answer_reward"}
    # the rollout file holds what the loss reads: the batch step 3 sampled, row by row
    assert [r.to_json() for r in phase.current.records] == hooks.seen[8:]
    for step in (1, 2, 3, 4):
        metrics = logged.metrics[step]
        for key in ("reward", "rewards/length/mean", "completions/mean_length"):
            assert key in metrics, (step, key)
        for key in ("timing/generation_s", "timing/weight_sync_s", "timing/train_s"):
            assert metrics[key] >= 0.0, (step, key)
    assert logged.metrics[1]["timing/generation_s"] > 0
    assert logged.metrics[2]["timing/generation_s"] == 0.0  # reused
    assert logged.metrics[2]["reward"] == logged.metrics[1]["reward"]

    checkpoint = tmp_path / "checkpoints" / "step_000002"
    meta = read_meta(checkpoint)
    assert set(meta["rollout_files"]) == {"arrays.npz", "records.json"}
    assert meta["rollouts"]["order"]["position"] == 2  # two prompts read
    assert meta["rollouts"]["batch"]["sampled_at"] == 1
    stored = json.loads((checkpoint / "rollouts" / "records.json").read_text())
    assert stored == hooks.seen[:8]
    arrays = checkpoint / "rollouts" / "arrays.npz"
    arrays.write_bytes(arrays.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="rollouts file arrays.npz has .* bytes"):
        read_meta(checkpoint)


def test_a_resumed_run_makes_the_uninterrupted_runs_rollouts_bit_for_bit(files, tmp_path):
    _, whole_logged, _, whole_backend, _ = run(files, tmp_path / "whole", 6)
    # killed after step 5: the checkpoint of step 3 holds the batch step 4 reuses; the
    # rollouts step 5 sampled are in the file already
    run(files, tmp_path / "cut", 5, save_every=3)
    cut_file = tmp_path / "cut" / "logs" / "rollouts.jsonl"
    assert {r["step"] for r in read_rollouts(cut_file)} == {1, 3, 5}
    resumed, logged, hooks, backend, _ = run(files, tmp_path / "cut", 6, resume="auto")
    assert resumed.resumed_from.name == "step_000003"
    assert [s for s, h in hooks.hooks if h == "on_rollout_end"] == [4]  # only step 5 samples
    # the same text, byte for byte: ids, completions, rewards, advantages, log-prob sums
    assert cut_file.read_bytes() == (tmp_path / "whole" / "logs" / "rollouts.jsonl").read_bytes()
    assert backend.w == whole_backend.w
    for step in (4, 5, 6):
        for key in ("reward", "reward_std", "rewards/length/mean", "completions/mean_length"):
            assert logged.metrics[step][key] == whole_logged.metrics[step][key], (step, key)


class StopOnRollouts(Callback):
    def on_rollout_end(self, driver, rollouts):
        if rollouts[0].step == 3:
            driver.control.request_stop(f"{len(rollouts)} rollouts seen")


def test_a_callback_stops_the_run_from_on_rollout_end(files, tmp_path):
    result, _, _, _, _ = run(files, tmp_path, 10, extra=[StopOnRollouts()])
    assert result.step == 3 and result.stop_reason == "8 rollouts seen"


def test_a_checkpoint_without_rollout_state_is_refused(files, tmp_path):
    Driver(ScalarBackend(), [Checkpoint(every_n_steps=1)], max_steps=1, run_dir=tmp_path).fit()
    with pytest.raises(CheckpointMismatch, match="holds no rollout state"):
        run(files, tmp_path, 2, resume="auto")


class RollBackOnce(Callback):
    """At the start of step 5, go back to the checkpoint of step 2 (as LossGuard does)."""

    def __init__(self) -> None:
        self.done = False

    def on_step_start(self, driver):
        if driver.step == 4 and not self.done:
            self.done = True
            driver.rollback(driver.checkpoint_dir / "step_000002")


def test_a_rollback_restores_the_rollouts_and_rewrites_their_records(files, tmp_path):
    run(files, tmp_path / "whole", 6)
    result, _, hooks, _, _ = run(files, tmp_path / "back", 6, save_every=2, extra=[RollBackOnce()])
    assert result.step == 6
    sampled = [s + 1 for s, h in hooks.hooks if h == "on_rollout_end"]
    assert sampled == [1, 3, 3, 5]  # step 3's rollouts made again after the rollback
    whole = (tmp_path / "whole" / "logs" / "rollouts.jsonl").read_bytes()
    assert (tmp_path / "back" / "logs" / "rollouts.jsonl").read_bytes() == whole


def test_a_reward_that_raises_on_the_first_rollouts_leaves_no_run_directory(files, tmp_path):
    """Bad input the first rollouts reveal (a reward function that raises) is refused as
    bad input found before training is: the run directory it created goes; once a step
    has trained, the run's directory stays (its logs say what happened)."""
    from baton.core.errors import UsageError
    from baton.core.rewards.function import Reward

    calls = {"n": 0}

    def fails_on(step: int):
        def reward(prompts, completions, completion_ids, **columns):
            calls["n"] += 1
            if calls["n"] == step:
                raise ValueError("cannot score this")
            return [1.0] * len(completions)

        return reward

    for step, stays in ((1, False), (2, True)):
        calls["n"] = 0
        run_dir = tmp_path / f"fails_at_{step}" / "run"
        phase = make_phase(files, rewards=[Reward("fails", fails_on(step))])
        driver = Driver(ScalarBackend(), [RolloutRecords()], rollouts=phase, max_steps=3,
                        log_every=1, run_dir=run_dir)  # fmt: skip
        with pytest.raises(UsageError, match="fails raised ValueError: cannot score this"):
            driver.fit()
        assert run_dir.exists() is stays, step
