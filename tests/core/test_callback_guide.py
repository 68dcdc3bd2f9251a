"""The callback guide cannot drift from the code: its table of hooks is the one
``baton.core.Callback`` gives (every hook of ``HOOKS``, in order, with its signature and
docstring), every driver attribute it names exists, and its table of what a hook may use
of the driver is ``DriverView``'s members, each of which ``Driver`` has."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from baton.core import Callback, Driver, DriverView
from baton.core.hooks import HOOKS
from baton.core.options import RunOptions

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-callback.md"


def hooks_table() -> str:
    """The table of hooks as the guide must show it."""
    rows = ["| hook | when |", "|---|---|"]
    for name in HOOKS:
        method = getattr(Callback, name)
        params = list(inspect.signature(method).parameters.values())[1:]  # self
        shown = ", ".join(f"{p.name}: {p.annotation}" for p in params)
        doc = " ".join((inspect.getdoc(method) or "").split()).replace("``", "`")
        rows.append(f"| `{name}({shown})` | {doc} |")
    return "\n".join(rows)


def test_the_guide_shows_every_hook_with_its_signature() -> None:
    text = GUIDE.read_text()
    found = re.search(r"<!-- hooks: begin -->\n(.*?)\n<!-- hooks: end -->", text, re.S)
    assert found is not None, "the guide lost its <!-- hooks: begin/end --> markers"
    expected = hooks_table()
    assert found.group(1) == expected, f"replace the guide's hook table with:\n{expected}"
    assert "`on_step_end(driver: DriverView, output: StepOutput)`" in expected


def test_the_driver_attributes_the_guide_names_exist() -> None:
    text = GUIDE.read_text()
    named = set(re.findall(r"^\| `driver\.(\w+)(?:\.\w+)?` \|", text, re.M))
    assert {"step", "options", "log_dir", "checkpoint_dir", "is_global_zero", "abilities"} <= named
    instance_attributes = {"options", "backend", "control", "eval_time_s", "evaluating_only"}
    init = inspect.getsource(Driver.__init__)
    for name in named:
        if name in instance_attributes:
            assert f"self.{name} =" in init, name
        else:
            assert isinstance(inspect.getattr_static(Driver, name), property), name
    assert "run_dir" in {f.name for f in dataclasses.fields(RunOptions)}


def view_members() -> set[str]:
    """The names ``DriverView`` declares (properties and methods)."""
    return {
        name
        for name, value in vars(DriverView).items()
        if not name.startswith("_") and (isinstance(value, property) or callable(value))
    }


def test_the_guide_lists_what_a_hook_may_use_of_the_driver() -> None:
    text = GUIDE.read_text()
    found = re.search(r"<!-- driver-view: begin -->\n(.*?)\n<!-- driver-view: end -->", text, re.S)
    assert found is not None, "the guide lost its <!-- driver-view: begin/end --> markers"
    listed = set(re.findall(r"^\| `driver\.(\w+)", found.group(1), re.M))
    members = view_members()
    assert listed == members, (
        f"in the guide, not the protocol: {listed - members}; "
        f"in the protocol, not the guide: {members - listed}"
    )
    assert {"backend", "options", "control", "step", "record", "rollback"} <= members
    for name in members:  # Driver has each (the type checker checks their types)
        assert hasattr(Driver, name) or f"self.{name} =" in inspect.getsource(Driver.__init__), name
