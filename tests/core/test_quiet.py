"""Quiet patches hide exactly the framework messages they name, and undo that on teardown."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, cast

import pytest

from baton.core.patches import PATCHES, PatchRecorder
from baton.core.quiet import Quiet, QuietPatch, QuietRecords, install_quiet, quiet_imports

LOGGER = "baton_test.framework"


class FrameworkQuiet(QuietPatch):
    """Hide two notes of a made-up framework."""

    name = "framework_quiet"
    backend = "framework"
    quiet = (
        Quiet("Accel is not installed", category=UserWarning, reason="no accelerator here"),
        Quiet("Model IS DEPRECATED", logger=LOGGER, reason="baton builds the model"),
    )


def emit(quiet_warnings: bool) -> tuple[list[str], list[str]]:
    """Warn and log the named notes and their neighbours: (warnings shown, records shown).
    Warnings are caught with only the quiet filters (``quiet_warnings``) before "always"."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger(LOGGER)
    handler = Collect()
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()  # inside catch_warnings: restored on exit
            warnings.simplefilter("always")
            if quiet_warnings:
                install_quiet(tuple(q for q in FrameworkQuiet.quiet if q.category))
            warnings.warn("Accel is not installed. Falling back.", UserWarning, stacklevel=1)
            warnings.warn("Accel is not installed. Falling back.", DeprecationWarning, stacklevel=1)
            warnings.warn("Your learning rate is negative", UserWarning, stacklevel=1)
            logger.warning("Model IS DEPRECATED. Use the new one.")
            logger.warning("Your config sets lr=-1")
    finally:
        logger.removeHandler(handler)
    return [str(w.message) for w in caught], records


def test_a_quiet_patch_hides_exactly_the_named_messages_and_undoes_it() -> None:
    logger = logging.getLogger(LOGGER)
    filters_before = list(warnings.filters)
    patch = FrameworkQuiet()
    patch.apply(cast(Any, None), patch.recorder)
    assert any(isinstance(f, QuietRecords) for f in logger.filters)
    shown, records = emit(quiet_warnings=True)
    # the same text in another category, and other messages of the same logger, still show
    assert shown == ["Accel is not installed. Falling back.", "Your learning rate is negative"]
    assert records == ["Your config sets lr=-1"]
    assert patch.recorder.undo() == []
    assert list(warnings.filters) == filters_before
    assert logger.filters == []
    assert emit(quiet_warnings=False) == (
        ["Accel is not installed. Falling back."] * 2 + ["Your learning rate is negative"],
        ["Model IS DEPRECATED. Use the new one.", "Your config sets lr=-1"],
    )


def test_spawned_processes_get_the_builtin_warning_filters_through_the_environment() -> None:
    recorder = PatchRecorder()
    before = os.environ.get("PYTHONWARNINGS")
    install_quiet(FrameworkQuiet.quiet, recorder)
    assert "ignore:Accel is not installed:UserWarning" in os.environ["PYTHONWARNINGS"].split(",")
    recorder.undo()
    assert os.environ.get("PYTHONWARNINGS") == before
    assert logging.getLogger(LOGGER).filters == []


def test_every_quiet_says_why_and_what_it_matches() -> None:
    with pytest.raises(ValueError, match="reason"):
        Quiet("x", category=UserWarning, reason="")
    with pytest.raises(ValueError, match="exactly one of category or logger"):
        Quiet("x", reason="r")
    with pytest.raises(ValueError, match="exactly one of category or logger"):
        Quiet("x", category=UserWarning, logger="a", reason="r")
    for _, cls in PATCHES.items():
        if issubclass(cls, QuietPatch):
            assert cls.distribution and cls.versions and cls.quiet, cls.name
            assert all(q.reason for q in cls.quiet), cls.name


def test_quiet_imports_installs_the_selected_frameworks_filters_before_a_recipe_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logger = logging.getLogger("megatron.core.models.gpt.gpt_model")
    # a fresh process's state: an in-process `baton run` earlier in this test session
    # (tests/core/test_cli.py) installed these filters for the rest of the process
    for f in [f for f in logger.filters if isinstance(f, QuietRecords)]:
        logger.removeFilter(f)
    monkeypatch.setenv("BATON_PATCHES", "all,-megatron_quiet")
    with warnings.catch_warnings():
        quiet_imports()
        assert not [f for f in logger.filters if isinstance(f, QuietRecords)]
    monkeypatch.setenv("BATON_PATCHES", "all")
    try:
        with warnings.catch_warnings():
            quiet_imports()
            (installed,) = [f for f in logger.filters if isinstance(f, QuietRecords)]
            assert installed.prefixes == ("GPTModel IS DEPRECATED",)
    finally:
        for name in ("megatron.core.models.gpt.gpt_model", "root"):
            target = logging.getLogger(name)
            for f in [f for f in target.filters if isinstance(f, QuietRecords)]:
                target.removeFilter(f)
