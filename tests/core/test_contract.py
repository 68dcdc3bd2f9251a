"""The backend contract (abilities checked before the first step) and the driver API
callbacks use instead of flipping attributes: save policy, save veto, rollback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from baton.core import Abilities, Ability, Callback, Driver, MissingAbilityError
from baton.core.checkpoints import files as ckpt
from support.scalar_backend import ScalarBackend


class Needs(Callback):
    def __init__(self, *wanted: Ability) -> None:
        self.wanted = frozenset(wanted)
        self.steps = 0

    def requires(self) -> frozenset[Ability]:
        return self.wanted

    def on_step_end(self, driver, output):
        self.steps += 1

    def __repr__(self) -> str:
        return f"Needs{tuple(sorted(self.wanted))}"


class ScalarWithoutEval(ScalarBackend):
    def abilities(self) -> Abilities:
        return Abilities()


def test_abilities_of_the_support_backend() -> None:
    # evaluate is declared; skip_data, async saves and several ranks are not
    assert ScalarBackend().abilities().names == {"evaluate"}
    assert ScalarWithoutEval().abilities().names == frozenset()


def test_a_declaration_is_one_typed_value_checked_when_made() -> None:
    declared = Abilities(evaluate=True, skip_data=True).refusing(skip_data="no stream to skip")
    assert declared.names == {"evaluate"} and not declared.skip_data
    assert declared.why_not("skip_data") == "refused: no stream to skip"
    assert declared.why_not("dry_run").startswith("dry_run(world_size)")
    with pytest.raises(ValueError, match="both offered and refused"):
        Abilities(evaluate=True, refused={"evaluate": "no"})
    with pytest.raises(ValueError, match="refusing names no ability"):
        Abilities().refusing(gradients="folded into model_state")


def test_a_method_of_an_ability_not_offered_is_refused_by_name() -> None:
    with pytest.raises(MissingAbilityError, match="backend 'scalar' does not offer 'skip_data'"):
        ScalarBackend().skip_data(1)


def test_an_evaluation_a_callback_asks_for_is_refused_where_not_declared(tmp_path) -> None:
    class AskEval(Callback):
        def on_step_end(self, driver, output):
            driver.control.request_eval("check")

    with pytest.raises(MissingAbilityError, match="does not offer 'evaluate'"):
        Driver(ScalarWithoutEval(), [AskEval()], max_steps=2, run_dir=tmp_path).fit()


def test_missing_ability_fails_before_the_first_step_naming_who_needs_what(tmp_path) -> None:
    needy = Needs("skip_data", "async_save")
    backend = ScalarBackend()
    with pytest.raises(MissingAbilityError) as error:
        Driver(backend, [needy], max_steps=5, run_dir=tmp_path).fit()
    message = str(error.value)
    assert "Needs('async_save', 'skip_data') needs 'skip_data'" in message
    assert "needs 'async_save'" in message and "backend 'scalar'" in message
    assert needy.steps == 0 and backend.events == ["setup", "teardown"]


def test_eval_every_needs_the_evaluate_ability(tmp_path) -> None:
    with pytest.raises(MissingAbilityError, match="eval_every=2 needs 'evaluate'"):
        Driver(ScalarWithoutEval(), max_steps=5, eval_every=2, run_dir=tmp_path).fit()


class Policy(Callback):
    def on_configure(self, driver):
        driver.configure_saving(on_stop=True)


class LatePolicy(Callback):
    def on_train_start(self, driver):
        driver.configure_saving(asynchronous=True)


def test_save_policy_is_configured_before_training(tmp_path) -> None:
    result = Driver(ScalarBackend(), [Policy()], max_steps=3, run_dir=tmp_path).fit()
    assert [p.name for p in result.checkpoints] == ["step_000003"]  # saved on stop
    with pytest.raises(RuntimeError, match="configure_saving after training started"):
        Driver(ScalarBackend(), [LatePolicy()], max_steps=3, run_dir=tmp_path / "late").fit()


class VetoAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, driver, output):
        driver.control.request_save("every step", all_ranks=True)
        if driver.step == self.step:
            driver.control.request_stop("broken", all_ranks=True)
            driver.control.veto_save("state is broken")


def test_a_vetoed_step_saves_neither_on_request_nor_on_stop(tmp_path) -> None:
    driver = Driver(ScalarBackend(), [VetoAt(3)], max_steps=9, run_dir=tmp_path)
    driver.configure_saving(on_stop=True)
    result = driver.fit()
    assert result.step == 3 and [p.name for p in result.checkpoints] == [
        "step_000001",
        "step_000002",
    ]


class RollbackAt(Callback):
    """Save every step; at step ``at`` go back to ``target``."""

    def __init__(self, at: int, target: int) -> None:
        self.at, self.target, self.done = at, target, False
        self.weights: dict[int, float] = {}

    def on_step_end(self, driver, output):
        driver.control.request_save("every step", all_ranks=True)
        self.weights.setdefault(driver.step, driver.backend.w)

    def on_step_start(self, driver):
        if driver.step == self.at and not self.done:
            self.done = True
            driver.rollback(driver.checkpoint_dir / ckpt.checkpoint_name(self.target))
            assert driver.backend.w == self.weights[self.target] and driver.step == self.target
            root = driver.checkpoint_dir
            assert [p.name for p in ckpt.list_checkpoints(root)] == ["step_000001", "step_000002"]
            assert ckpt.latest(root) == (root / "step_000002").resolve()


def test_rollback_discards_newer_checkpoints_and_rewrites_latest(tmp_path) -> None:
    back = RollbackAt(at=5, target=2)
    driver = Driver(ScalarBackend(), [back], max_steps=4, run_dir=tmp_path)
    result = driver.fit()
    assert result.step == 4 and back.done is False  # never reached step 5
    driver = Driver(ScalarBackend(), [back], max_steps=6, run_dir=tmp_path, resume="auto")
    result = driver.fit()
    root = tmp_path / "checkpoints"
    # 3, 4 and 5 were discarded at the rollback; steps 3..6 were trained and saved again
    names = [p.name for p in ckpt.list_checkpoints(root)]
    assert back.done and names == [ckpt.checkpoint_name(s) for s in range(1, 7)]
    assert [p.name for p in result.checkpoints] == [ckpt.checkpoint_name(s) for s in (3, 4, 5, 6)]
    assert ckpt.latest(root) == (root / "step_000006").resolve()


class SlowAsyncScalar(ScalarBackend):
    """Its asynchronous save writes on a thread, a little later."""

    def abilities(self):
        return Abilities(evaluate=True, async_save=True)

    def save(self, directory: Path, *, asynchronous: bool = False) -> Any:
        import threading
        import time

        if not asynchronous:
            return super().save(directory)
        state = ScalarBackend()
        state.w, state.rng = self.w, self.rng

        class Pending:
            def __init__(self) -> None:
                self.thread = threading.Thread(target=self.write)
                self.thread.start()

            def write(self) -> None:
                time.sleep(0.3)
                ScalarBackend.save(state, directory)

            def done(self) -> bool:
                return not self.thread.is_alive()

            def wait(self) -> None:
                self.thread.join()

        return Pending()


class LoadRightAfterAsyncSave(Callback):
    def on_step_end(self, driver: Driver, output: object) -> None:
        if driver.step == 3:
            driver.control.request_save("now", all_ranks=True)

    def on_step_start(self, driver: Driver) -> None:
        if driver.step == 3 and driver.backend.events.count("loaded") == 0:
            driver.backend.events.append("loaded")
            driver.load_checkpoint(driver.checkpoint_dir / ckpt.checkpoint_name(3))


def test_load_checkpoint_waits_for_the_save_still_being_written(tmp_path) -> None:
    """A rollback to a checkpoint whose asynchronous save is in flight loads it once the
    write completes (it is not taken for a half-written one)."""
    result = Driver(
        SlowAsyncScalar(), [LoadRightAfterAsyncSave()], max_steps=5, run_dir=tmp_path,
        async_save=True,
    ).fit()  # fmt: skip
    assert result.step == 5
