"""The runs the conformance suite compares, each a real ``Driver`` over a backend from
``factories.build``, and the callbacks that look at the backend while it is set up.

    runs = conformance_runs("fabric", tmp_path)
    runs.resumed == {s: runs.full[s] for s in runs.resumed}   # bitwise
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from baton.core import Ability, Callback, Driver
from conformance.factories import build
from support.recording import Losses

#: steps of the uninterrupted run; the interrupted one saves at SAVE_AT and resumes
STEPS, SAVE_AT = 4, 2
ABILITIES: tuple[Ability, ...] = get_args(Ability)


@dataclass
class Runs:
    """What one backend's runs showed (``problems``: an ability's call that failed)."""

    full: dict[int, float] = field(default_factory=dict)
    first: dict[int, float] = field(default_factory=dict)
    resumed: dict[int, float] = field(default_factory=dict)
    resumed_from: Path | None = None
    plans: list[Any] = field(default_factory=list)
    saved_state: dict[str, float] = field(default_factory=dict)
    loaded_state: dict[str, float] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)


def run(name: str, run_dir: Path, callbacks: list[Callback], **options: Any) -> Losses:
    """One run of backend ``name`` (a fresh backend) under ``run_dir``; its losses."""
    losses = Losses()
    backend = build(name, run_dir)
    Driver(backend, [losses, *callbacks], log_every=1, run_dir=run_dir, **options).fit()
    return losses


def squares(driver: Driver) -> dict[str, float]:
    """Each parameter's sum of squares, through the model-state view (empty without it)."""
    if "model_state" not in driver.backend.abilities().names:
        return {}
    state = driver.backend.model_state()
    return state.fetch(state.sum_over_ranks(piece_squares(state)))


def piece_squares(state: Any) -> dict[str, Any]:
    from array_api_compat import array_namespace

    values: dict[str, Any] = {}
    for piece in state.parameters():
        if piece.counted:
            xp = array_namespace(piece.value)
            value = xp.astype(piece.value, xp.float32)
            values[piece.name] = xp.sum(value * value)
    return values


class AtTrainEnd(Callback):
    """Calls ``look(driver)`` when training ended (the backend still set up)."""

    def __init__(self, look: Callable[[Driver], None]) -> None:
        self.look = look

    def on_train_end(self, driver: Driver) -> None:
        self.look(driver)


class PlansTwice(Callback):
    """Before the resume loads: ``plan_load`` of this run's layout and of the saved one,
    each asked twice (a plan has no side effect: the load that follows is unchanged)."""

    def __init__(self, checkpoint: Path, plans: list[Any]) -> None:
        self.saved = json.loads((checkpoint / "baton.json").read_text())["checkpoint"]["layout"]
        self.plans = plans

    def on_setup(self, driver: Driver) -> None:
        own = driver.backend.checkpoint_facts().layout
        for layout in (own, own, self.saved, self.saved):
            self.plans.append(driver.backend.plan_load(layout))


class AfterLoad(Callback):
    """Once the resume loaded: ``look(driver)``."""

    def __init__(self, look: Callable[[Driver], None]) -> None:
        self.look = look

    def on_train_start(self, driver: Driver) -> None:
        self.look(driver)


def conformance_runs(name: str, root: Path) -> Runs:
    """The uninterrupted run, the run saved at ``SAVE_AT`` and its resume (asking for
    load plans twice first), and the abilities' probe."""
    runs = Runs()
    runs.full = run(name, root / "full", [], max_steps=STEPS).values

    def keep_saved(driver: Driver) -> None:
        runs.saved_state = squares(driver)

    first = run(name, root / "cut", [AtTrainEnd(keep_saved)], max_steps=SAVE_AT, save_on_stop=True)
    runs.first = first.values
    checkpoint = root / "cut" / "checkpoints" / f"step_{SAVE_AT:06d}"

    def keep_loaded(driver: Driver) -> None:
        runs.loaded_state = squares(driver)
        runs.resumed_from = driver.resumed_from

    resumed = run(
        name,
        root / "resumed",
        [PlansTwice(checkpoint, runs.plans), AfterLoad(keep_loaded)],
        max_steps=STEPS,
        resume=str(checkpoint),
    )
    runs.resumed = resumed.values
    return runs


# -- the abilities' probe --------------------------------------------------------------


def attempt(results: dict[str, Any], key: str, call: Callable[[], Any]) -> None:
    """``results[key]``: what ``call()`` returned, or the exception it raised."""
    try:
        results[key] = call()
    except Exception as error:  # kept for the test to show
        results[key] = error
        results[f"{key}:traceback"] = traceback.format_exc()


class Probe(Callback):
    """Calls every ability's methods on a set-up backend over three steps: skips one
    step's data after step 1, replays step 3 (asked after step 2), and when training
    ended calls the rest of what it offers and the methods of what it does not."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.results = results

    def on_step_end(self, driver: Driver, output: Any) -> None:
        backend, offered = driver.backend, driver.backend.abilities().names
        if driver.step == 1 and "skip_data" in offered:
            attempt(self.results, "skip_data", lambda: backend.skip_data(1))
        if driver.step == 2 and "step_replay" in offered:
            attempt(self.results, "replay_next_step", backend.replay_next_step)
        if driver.step == 3 and "step_replay" in offered:
            attempt(self.results, "gather_replay_mismatches", backend.gather_replay_mismatches)

    def on_train_end(self, driver: Driver) -> None:
        backend, results = driver.backend, self.results
        declared = results["declared"] = backend.abilities()
        for ability in ABILITIES:
            if ability not in declared.names:
                attempt(results, f"lacking:{ability}", lambda a=ability: call_lacking(backend, a))
        if "evaluate" in declared.names:
            attempt(results, "evaluate", lambda: backend.fetch(backend.evaluate()))
        if "model_state" in declared.names:
            attempt(results, "model_state", lambda: model_state_facts(backend.model_state()))
        if "multi_rank" in declared.names:
            attempt(results, "all_reduce_flags", lambda: backend.all_reduce_flags([True, False]))
            attempt(results, "barrier", backend.barrier)
        if "weight_checksums" in declared.names:
            attempt(results, "weight_checksums", backend.gather_weight_checksums)
        if "async_save" in declared.names:
            directory = driver.options.run_dir / "async-save"
            attempt(results, "async_save", lambda: save_and_wait(backend, directory))


def call_lacking(backend: Any, ability: Ability) -> Any:
    """Call the method of an ability ``backend`` does not offer (``BackendBase`` raises
    ``MissingAbilityError``); ``None`` for those that have no method of their own."""
    calls: dict[str, Callable[[], Any]] = {
        "evaluate": backend.evaluate,
        "skip_data": lambda: backend.skip_data(1),
        "model_state": backend.model_state,
        "weight_checksums": backend.gather_weight_checksums,
        "step_replay": backend.replay_next_step,
        "dry_run": lambda: backend.dry_run(1),
    }
    return calls[ability]() if ability in calls else None


def save_and_wait(backend: Any, directory: Path) -> list[str]:
    directory.mkdir(parents=True)
    pending = backend.save(directory, asynchronous=True)
    pending.wait()
    return sorted(p.name for p in directory.iterdir())


def model_state_facts(state: Any) -> dict[str, Any]:
    """Names, shapes and the sum of squares two ways: per piece through
    ``sum_over_ranks`` and ``fetch``, and over the host copies of the pieces in float64."""
    import numpy as np

    pieces = state.parameters()
    through_view = state.fetch(state.sum_over_ranks(piece_squares(state)))
    on_host = {
        piece.name: float(np.sum(host(piece.value).astype(np.float64) ** 2)) for piece in pieces
    }
    shapes_agree = all(
        len(piece.index) == len(piece.global_shape)
        and tuple(s.stop - s.start for s in piece.index) == tuple(host(piece.value).shape)
        for piece in pieces
    )
    groups = state.optimizer_groups()
    return {
        "names": [piece.name for piece in pieces],
        "through_view": through_view,
        "on_host": on_host,
        "shapes_agree": shapes_agree,
        "groups": len(groups),
        "lr_finite": all(math.isfinite(g.lr) for g in groups),
    }


def host(value: Any) -> Any:
    import numpy as np

    if hasattr(value, "detach"):
        return value.detach().float().cpu().numpy()
    return np.asarray(value)


def probe(name: str, root: Path) -> dict[str, Any]:
    """Three steps with the ``Probe`` (``losses``: their losses); and ``dry_run``,
    asked before any setup."""
    results: dict[str, Any] = {}
    fresh = build(name, root / "dry")
    attempt(results, "declared_before_setup", fresh.abilities)
    before = results["declared_before_setup"]
    if not isinstance(before, Exception) and "dry_run" in before.names:
        attempt(results, "dry_run", lambda: fresh.dry_run(1))
    results["losses"] = run(name, root / "probe", [Probe(results)], max_steps=3).values
    return results
