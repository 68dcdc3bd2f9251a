"""Patches: recorder undo, version gating, selection, reporting."""

from __future__ import annotations

import json
import os
import types

import pytest

from baton.core import Driver, Patch, PatchRecorder
from baton.core.patches import PATCHES, parse_selection, select_patches, version_matches
from support.scalar_backend import ScalarBackend

TARGET = types.SimpleNamespace(flag="original", table={"k": 1})


@pytest.fixture
def scalar_patches():
    """Register two real patches for the scalar backend; remove them afterwards."""

    class SetFlag(Patch):
        """Change an attribute, a dict entry and an env var in the configure phase."""

        name = "test_set_flag"
        backend = "scalar"
        versions = ">=1.0,<2"
        phase = "configure"

        def apply(self, driver, recorder):
            recorder.setattr(TARGET, "flag", "patched")
            recorder.setattr(TARGET, "added", True)
            recorder.setitem(TARGET.table, "k", 2)
            recorder.setitem(TARGET.table, "new", 3)
            recorder.setenv("BATON_TEST_PATCH", "on")

    class OnlyOldVersions(Patch):
        """Would apply to scalar 0.x only."""

        name = "test_old_only"
        backend = "scalar"
        versions = "<1.0"
        phase = "setup"

        def apply(self, driver, recorder):
            recorder.setattr(TARGET, "flag", "old")

    class NeedsCondition(Patch):
        """Applies only when the learning rate is large."""

        name = "test_conditional"
        backend = "scalar"
        phase = "train_start"

        def condition(self, backend):
            return (backend.config["lr"] > 0.5, f"lr={backend.config['lr']}")

        def apply(self, driver, recorder):
            recorder.setattr(TARGET, "flag", "conditional")

    for cls in (SetFlag, OnlyOldVersions, NeedsCondition):
        PATCHES.add(cls.name, cls)
    yield
    for cls in (SetFlag, OnlyOldVersions, NeedsCondition):
        PATCHES._items.pop(cls.name)


def test_recorder_undoes_in_reverse_order():
    obj = types.SimpleNamespace(a=1)
    rec = PatchRecorder()
    rec.setattr(obj, "a", 2)
    rec.setattr(obj, "a", 3)
    rec.setenv("BATON_REC_TEST", "x")
    order = []
    rec.on_undo("custom", lambda: order.append("custom"))
    assert obj.a == 3 and os.environ["BATON_REC_TEST"] == "x"
    assert rec.undo() == []
    assert obj.a == 1 and "BATON_REC_TEST" not in os.environ and order == ["custom"]


def test_patch_applies_in_phase_and_undoes_after_a_run_that_raised(
    tmp_path, scalar_patches, monkeypatch
):
    monkeypatch.delenv("BATON_PATCHES", raising=False)
    seen = {}

    class Peek(ScalarBackend):
        def train_step(self, step):
            seen.update(
                flag=TARGET.flag, k=TARGET.table["k"], env=os.environ.get("BATON_TEST_PATCH")
            )
            return super().train_step(step)

    driver = Driver(Peek(fail_at=2), max_steps=5, run_dir=tmp_path)
    with pytest.raises(RuntimeError):
        driver.fit()
    assert seen == {"flag": "patched", "k": 2, "env": "on"}
    assert TARGET.flag == "original" and not hasattr(TARGET, "added")
    assert TARGET.table == {"k": 1} and "BATON_TEST_PATCH" not in os.environ
    on_disk = json.loads((tmp_path / "patches.json").read_text())
    assert {p["name"]: p["applied"] for p in on_disk["patches"]}["test_set_flag"] is True
    report = {d.name: d for d in driver.patch_report}
    assert report["test_set_flag"].applied
    assert not report["test_old_only"].applied and "outside <1.0" in report["test_old_only"].reason
    assert not report["test_conditional"].applied and "lr=0.1" in report["test_conditional"].reason


@pytest.mark.parametrize(
    ("spec", "installed", "expected"),
    [
        (">=0.3,<0.4", "0.3.0", True),
        (">=0.3,<0.4", "0.4.0", False),
        (">=0.3,<0.4", "0.3.1.dev20260101", True),
        (">=0.19,<0.20", "0.19.2", True),
        (">=0.19,<0.20", "0.18.9", False),
        ("", "anything", True),
        (">=0.2.5,<0.3", "0.2.5", True),
        (">=0.2.5,<0.3", "not-a-version", False),
    ],
)
def test_version_gating(spec, installed, expected):
    assert version_matches(spec, installed) is expected


def test_version_gating_applies_and_skips_for_installed_version(scalar_patches, monkeypatch):
    monkeypatch.delenv("BATON_PATCHES", raising=False)
    applied_new = {d.name for d in select_patches(ScalarBackend(version="1.4"))[1] if d.applied}
    applied_old = {d.name for d in select_patches(ScalarBackend(version="0.9"))[1] if d.applied}
    assert applied_new == {"test_set_flag"}
    assert applied_old == {"test_old_only"}


def test_selection_by_environment_variable(scalar_patches, monkeypatch, tmp_path):
    names = ["test_set_flag", "test_old_only", "test_conditional"]
    monkeypatch.setenv("BATON_PATCHES", "none")
    assert parse_selection(None, names)[0] == set()
    monkeypatch.setenv("BATON_PATCHES", "all,-test_set_flag")
    assert parse_selection(None, names)[0] == {"test_old_only", "test_conditional"}
    monkeypatch.setenv("BATON_PATCHES", "-test_old_only")
    assert parse_selection(None, names)[0] == {"test_set_flag", "test_conditional"}
    monkeypatch.setenv("BATON_PATCHES", "test_conditional")
    assert parse_selection(None, names)[0] == {"test_conditional"}
    # a recipe argument wins over the environment
    assert parse_selection("none", names)[0] == set()
    monkeypatch.setenv("BATON_PATCHES", "none")
    driver = Driver(ScalarBackend(lr=0.9), max_steps=1, run_dir=tmp_path)
    driver.fit()
    assert not any(d.applied for d in driver.patch_report)
    assert all("deselected by BATON_PATCHES" in d.reason for d in driver.patch_report)


def test_unknown_patch_name_is_a_clear_error(scalar_patches):
    with pytest.raises(ValueError, match="unknown patch 'nope'.*test_set_flag"):
        select_patches(ScalarBackend(), "nope")


def test_bad_patch_definitions_are_rejected():
    with pytest.raises(ValueError, match="phase"):
        type("BadPhase", (Patch,), {"name": "x", "backend": "scalar", "phase": "whenever"})
    with pytest.raises(ValueError, match="version range"):
        type("BadRange", (Patch,), {"name": "x", "backend": "scalar", "versions": "~~1"})


@pytest.mark.parametrize("verbose", [False, True])
def test_a_run_logs_one_patch_line_and_each_patch_at_verbose(
    tmp_path, scalar_patches, monkeypatch, capsys, verbose
):
    import logging

    from baton.core.checkpoints.run_record import patch_summary
    from baton.core.logs import setup_logging

    monkeypatch.delenv("BATON_PATCHES", raising=False)
    logger = setup_logging(level=logging.DEBUG if verbose else logging.INFO)
    try:
        driver = Driver(ScalarBackend(), max_steps=1, run_dir=tmp_path)
        driver.fit()
    finally:
        logger.setLevel(logging.INFO)
    lines = capsys.readouterr().out.splitlines()
    summary = patch_summary(driver.patch_report, tmp_path / "patches.json")
    assert summary.startswith("patches: 1 applied (test_set_flag), 2 skipped; details in ")
    assert [line for line in lines if "patches:" in line] == [
        line for line in lines if line.endswith(summary)
    ]
    assert len([line for line in lines if "patches:" in line]) == 1
    each = [line for line in lines if " patch test_" in line]
    assert len(each) == (3 if verbose else 0)
    if verbose:
        assert any("test_old_only" in line and "skipped (" in line for line in each)
