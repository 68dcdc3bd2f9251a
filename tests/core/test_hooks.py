"""Hook order, dispatch cost, exception and teardown order over whole runs."""

from __future__ import annotations

import pytest

from baton.core import HOOKS, Callback, Driver
from baton.core.dispatch import Dispatcher
from support.scalar_backend import ScalarBackend


class Recorder(Callback):
    """Records every hook call as (tag, hook)."""

    def __init__(self, tag: str, log: list[tuple[str, str]], priority: int = 0) -> None:
        self.tag = tag
        self.log = log
        self.priority = priority  # type: ignore[misc]

    def _rec(self, hook: str) -> None:
        self.log.append((self.tag, hook))


for _hook in HOOKS:
    setattr(Recorder, _hook, (lambda h: lambda self, *a: self._rec(h))(_hook))


def test_full_run_hook_order_priorities_and_reverse_exit(tmp_path):
    log: list[tuple[str, str]] = []
    cbs = [Recorder("b", log, 10), Recorder("a", log, -5), Recorder("c", log, 10)]
    driver = Driver(ScalarBackend(), cbs, max_steps=2, log_every=1, eval_every=2, run_dir=tmp_path)
    driver.fit()
    hooks = [h for t, h in log if t == "a"]
    # evaluation is its own phase: its metrics reach on_eval_end, never on_log
    assert hooks == [
        "on_configure",
        "on_setup",
        "on_train_start",
        "on_step_start",
        "on_step_end",
        "on_log",
        "on_step_start",
        "on_step_end",
        "on_log",
        "on_eval_start",
        "on_eval_end",
        "on_train_end",
        "on_teardown",
    ]
    # entry hooks: priority then list order; exit hooks: reversed
    by_hook = {}
    for tag, hook in log:
        by_hook.setdefault(hook, []).append(tag)
    assert by_hook["on_configure"] == ["a", "b", "c"]
    assert by_hook["on_step_end"] == ["a", "b", "c"] * 2
    assert by_hook["on_train_end"] == ["c", "b", "a"]
    assert by_hook["on_teardown"] == ["c", "b", "a"]


def test_exception_in_step_calls_on_exception_then_teardown_in_reverse(tmp_path):
    log: list[tuple[str, str]] = []
    backend = ScalarBackend(fail_at=3)
    driver = Driver(
        backend, [Recorder("x", log, 0), Recorder("y", log, 1)], max_steps=10, run_dir=tmp_path
    )
    with pytest.raises(RuntimeError, match="step 3 failed"):
        driver.fit()
    tail = log[-4:]
    assert tail == [
        ("y", "on_exception"),
        ("x", "on_exception"),
        ("y", "on_teardown"),
        ("x", "on_teardown"),
    ]
    assert ("x", "on_train_end") not in log
    assert driver.step == 2
    assert backend.events == ["setup", "teardown"]
    assert "step 3 failed" in driver.stop_reason


class OnlyLog(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_log(self, driver, metrics):
        self.calls += 1


def test_callbacks_that_override_nothing_are_never_called(tmp_path):
    class Nothing(Callback):
        def __getattribute__(self, name):  # any hook lookup on the instance would be seen
            if name.startswith("on_"):
                raise AssertionError(f"{name} was looked up on a callback that overrides nothing")
            return object.__getattribute__(self, name)

    only = OnlyLog()
    dispatcher = Dispatcher([Nothing(), only])
    assert all(dispatcher.handlers(h) == () for h in HOOKS if h != "on_log")
    assert len(dispatcher.handlers("on_log")) == 1
    Driver(ScalarBackend(), [Nothing(), only], max_steps=5, log_every=1, run_dir=tmp_path).fit()
    assert only.calls == 5


def test_duplicate_state_keys_are_an_error(tmp_path):
    class Stateful(Callback):
        state_key = "same"

    with pytest.raises(ValueError, match="state_key"):
        Driver(ScalarBackend(), [Stateful(), Stateful()], max_steps=1, run_dir=tmp_path).fit()
