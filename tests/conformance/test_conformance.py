"""Every backend keeps the contract, checked the same way on each (``suite_backends()``:
the example backend of ``examples/minimal_backend.py`` and every declared backend, the
six):

- saved at step 2 and loaded by a fresh backend, a run continues with bitwise the losses
  of the uninterrupted run;
- each ability it declares works when called, and each it does not offer raises
  ``MissingAbilityError`` or is refused with a reason;
- ``plan_load`` of its own layout loads everything, and asking for a plan changes
  nothing (asked twice before the resume loads, the resume is still bitwise);
- ``model_state`` shows named parameters whose sums over ranks are the arrays' own, and
  the weights a resume loaded are the weights that were saved.

The framework backends build a real model each (seconds to a minute on CPU): they are
``slow``; the example runs in a second.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from baton.core import LOAD_ALL, MissingAbilityError
from conformance.factories import suite_backends
from conformance.harness import ABILITIES, SAVE_AT, STEPS, Runs, conformance_runs, probe

FAST = {"minimal"}
NAMES = [
    pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in suite_backends()
]


@pytest.fixture(scope="module", params=NAMES)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def runs(backend_name: str, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return conformance_runs(backend_name, tmp_path_factory.mktemp(f"runs-{backend_name}"))


@pytest.fixture(scope="module")
def probed(backend_name: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return probe(backend_name, tmp_path_factory.mktemp(f"probe-{backend_name}"))


def returned(results: dict[str, Any], key: str) -> Any:
    """What the probe's call ``key`` returned (its traceback shown if it raised)."""
    value = results[key]
    assert not isinstance(value, Exception), results.get(f"{key}:traceback", value)
    return value


def test_save_load_continue_is_bitwise(runs: Runs) -> None:
    assert sorted(runs.full) == list(range(1, STEPS + 1))
    assert runs.first == {s: runs.full[s] for s in range(1, SAVE_AT + 1)}
    assert runs.resumed_from is not None and runs.resumed_from.name == f"step_{SAVE_AT:06d}"
    assert runs.resumed == {s: runs.full[s] for s in range(SAVE_AT + 1, STEPS + 1)}
    assert len(set(runs.full.values())) > 1  # it trains: the losses move


def test_declared_abilities_work(probed: dict[str, Any], runs: Runs) -> None:
    """The probe ran 3 steps beside the uninterrupted run: skipping one step's data after
    step 1 changes step 2's loss; replaying step 3 leaves its loss as it was."""
    declared = returned(probed, "declared")
    offered = declared.names
    losses, full = probed["losses"], runs.full
    assert losses[1] == full[1]
    if "evaluate" in offered:
        metrics = returned(probed, "evaluate")
        assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics
    if "skip_data" in offered:
        returned(probed, "skip_data")
        assert losses[2] != full[2]  # another batch
    else:
        assert losses[2] == full[2]
    if "model_state" in offered:
        assert returned(probed, "model_state")["names"]
    if "multi_rank" in offered:
        assert returned(probed, "all_reduce_flags") == [True, False]
        returned(probed, "barrier")
    if "weight_checksums" in offered:
        checksums = returned(probed, "weight_checksums")
        assert len(checksums) == 1 and checksums[0], checksums
    if "step_replay" in offered:
        assert returned(probed, "replay_next_step") is True
        assert returned(probed, "gather_replay_mismatches") == [[]]
        if "skip_data" not in offered:  # the second run of the step stands: the same loss
            assert losses[3] == full[3]
    if "async_save" in offered:
        assert returned(probed, "async_save")  # files written once waited for
    before_setup = returned(probed, "declared_before_setup")
    if "dry_run" in before_setup.names:
        plan = returned(probed, "dry_run")
        assert isinstance(plan, str) and plan.strip()


def test_abilities_not_offered_are_refused(probed: dict[str, Any]) -> None:
    """Each ability not offered is refused with a reason, or its method (where it has
    one) raises ``MissingAbilityError`` naming it."""
    declared = returned(probed, "declared")
    for ability in set(ABILITIES) - declared.names:
        if ability in declared.refused:
            reason = declared.refused[ability]
            assert isinstance(reason, str) and reason.strip(), ability
            continue
        outcome = probed[f"lacking:{ability}"]
        if outcome is not None:  # BackendBase's method refuses it
            shown = probed.get(f"lacking:{ability}:traceback", outcome)
            assert isinstance(outcome, MissingAbilityError), shown
            assert repr(ability) in str(outcome)


def test_plan_load_has_no_refusal_and_no_side_effect(runs: Runs, backend_name: str) -> None:
    own, own_again, saved, saved_again = runs.plans
    assert own.refusal is None and own.loads_everything, own
    assert own == own_again and saved == saved_again
    assert saved.refusal is None
    # the resume loaded after the plans were asked for, and continued bitwise
    assert runs.resumed == {s: runs.full[s] for s in range(SAVE_AT + 1, STEPS + 1)}
    assert LOAD_ALL.loads_everything


def test_model_state_names_and_reductions(probed: dict[str, Any], runs: Runs) -> None:
    declared = returned(probed, "declared")
    if "model_state" not in declared.names:
        pytest.skip("no model_state")
    facts = returned(probed, "model_state")
    names = facts["names"]
    assert len(names) == len(set(names)) and all(names)
    assert facts["shapes_agree"]
    assert sorted(facts["through_view"]) == sorted(facts["on_host"])
    for name, total in facts["through_view"].items():
        assert total == pytest.approx(facts["on_host"][name], rel=1e-5), name
    assert facts["groups"] >= 1 and facts["lr_finite"]
    # the resume's weights, read through the view, are those the saving run held
    assert runs.loaded_state and runs.loaded_state == runs.saved_state
