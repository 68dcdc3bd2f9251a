"""Callbacks from the command line and config files, on any recipe without changing it:
``--callback NAME:key=value``, ``--no-callback NAME``, a config's ``callbacks:`` list,
``baton callbacks NAME``, ``--console-keys``, and a third-party callback registered
through an installed distribution's entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from baton.callbacks import Checkpoint, CompositeLogger, Goodput, Watchdog
from baton.core.cli.command import main
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from baton.core.logs import setup_logging

ROOT = Path(__file__).resolve().parents[2]
SCALAR = ROOT / "tests" / "safety" / "recipe_scalar.py"


def test_callbacks_added_configured_dropped_and_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config file adds one callback, the command line another and reconfigures the
    recipe's checkpoint; --no-callback drops the recipe's logger; all of it is typed from
    the signatures, shown by --print-config and recorded in run.json."""
    config = tmp_path / "exp.yaml"
    config.write_text(
        "max_steps: 4\ncallbacks:\n  - name: watchdog\n    timeout_s: 600\n    action: abort\n"
    )
    run_dir = tmp_path / "run"
    argv = ["--run-dir", str(run_dir), "--config", str(config), "--no-callback", "logger"]
    argv += ["--callback", "goodput:interval_s=2", "--callback", "checkpoint:every_n_steps=2"]
    assert build_driver(SCALAR, [*argv, "--print-config"]) is None
    shown = capsys.readouterr().out
    assert "- name: watchdog\n  timeout_s: 600.0\n" in shown and "action: abort" in shown
    assert "no_callbacks:\n- logger" in shown

    driver = build_driver(SCALAR, argv)
    assert driver is not None
    kinds = [type(cb) for cb in driver.callbacks]
    assert kinds == [Checkpoint, Watchdog, Goodput]  # the recipe's Checkpoint, replaced
    checkpoint, watchdog, goodput = driver.callbacks
    assert isinstance(checkpoint, Checkpoint) and checkpoint.every_n_steps == 2
    assert isinstance(watchdog, Watchdog) and (watchdog.timeout_s, watchdog.action) == (
        600.0,
        "abort",
    )
    assert isinstance(goodput, Goodput)
    assert driver.fit().step == 4
    record = json.loads((run_dir / "run.json").read_text())
    names = [c["name"] for c in record["settings"]["callbacks"]]
    assert names == ["watchdog", "goodput", "checkpoint"]
    assert record["settings"]["no_callbacks"] == ["logger"]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == [
        "step_000002",
        "step_000004",
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--callback", "wachdog"], "unknown callback 'wachdog'; did you mean 'watchdog'?"),
        (["--callback", "emma"], "unknown callback 'emma'; did you mean 'ema'?"),
        (["--callback", "zzz"], "unknown callback 'zzz'; registered callbacks: checkpoint,"),
        (
            ["--callback", "watchdog:timeout=3"],
            "has no argument 'timeout'; did you mean 'timeout_s'?",
        ),
        (["--callback", "watchdog:zz=3"], "has no argument 'zz'; it takes: timeout_s,"),
        (["--callback", "watchdog:timeout_s=soon"], "timeout_s is 'soon', not a number"),
        (["--callback", "watchdog:action=explode"], "not one of 'warn', 'abort'"),
        (["--callback", "watchdog:timeout_s=-1"], "timeout_s and poll_s must be > 0"),
        (["--no-callback", "progres"], "--no-callback progres: unknown callback"),
        (["--console-keys", "+w"], "this run prints no console line"),
    ],
)
def test_bad_callback_flags_are_one_line_errors(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    argv = ["--run-dir", str(tmp_path / "run"), "--sinks", "jsonl", *flags]
    with pytest.raises(UsageError, match=None) as error:
        build_driver(SCALAR, argv)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert error.value.exit_status == 2


def test_bad_config_callbacks(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text("callbacks:\n  - name: watchdog\n    timeout_s: soon\n")
    with pytest.raises(UsageError, match="timeout_s is 'soon', not a number"):
        build_driver(SCALAR, ["--run-dir", str(tmp_path), "--config", str(config)])
    config.write_text("callbacks: watchdog\n")
    with pytest.raises(UsageError, match="callbacks: expected a list"):
        build_driver(SCALAR, ["--run-dir", str(tmp_path), "--config", str(config)])


def test_console_keys_show_a_models_own_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scalar model logs its own metric ``w``; --console-keys puts it on the line."""
    argv = ["--run-dir", str(tmp_path), "--sinks", "console", "--max-steps", "2"]
    driver = build_driver(SCALAR, [*argv, "--console-keys", "loss,w"])
    assert driver is not None
    logger = next(cb for cb in driver.callbacks if isinstance(cb, CompositeLogger))
    assert logger.console_keys() == ["loss", "w"]
    driver.fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert lines and all(" | loss " in line and " | w " in line for line in lines)
    assert all("samples" not in line for line in lines)
    # '+key' adds to the recipe's keys; a line of every metric already shows it
    every = build_driver(SCALAR, [*argv, "--console-keys", "+w"])
    assert every is not None
    logger = next(cb for cb in every.callbacks if isinstance(cb, CompositeLogger))
    assert logger.console_keys() == []
    with pytest.raises(UsageError, match="mix of"):
        build_driver(SCALAR, [*argv, "--console-keys", "loss,+w"])


def test_baton_callbacks_name_lists_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["callbacks", "logger"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "rank_zero_only" in out and "true or false" in out and "only rank 0 logs" in out
    assert main(["callbacks", "nope"]) == 2
    assert "unknown callback 'nope'" in capsys.readouterr().err


PLUGIN = '''
"""A third-party callback, registered when baton loads its plugins."""

from baton.core import Callback
from baton.core.registry import CALLBACKS


@CALLBACKS.register("say_step")
class SayStep(Callback):
    """Print the step every few steps.

    Args:
        every: print every this many steps.
        prefix: text before the step.
    """

    def __init__(self, every: int = 1, prefix: str = "at") -> None:
        self.every = every
        self.prefix = prefix

    def on_step_end(self, driver, output) -> None:
        if driver.step % self.every == 0:
            print(self.prefix, "step", driver.step, flush=True)
'''


def test_a_third_party_callback_from_an_installed_distribution(tmp_path: Path) -> None:
    """A distribution (module + ``.dist-info`` with an entry point in ``baton.plugins``)
    on the path: its callback is listed, documented and added like a standard one."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "say_step_plugin.py").write_text(PLUGIN)
    info = site / "say_step_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: say-step-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[baton.plugins]\nsay_step = say_step_plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "tests")])}

    def baton(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "baton.core.cli.command", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )

    listed = baton("callbacks", "say_step")
    assert listed.returncode == 0, listed.stderr
    assert "print every this many steps" in " ".join(listed.stdout.split())
    ran = baton(
        "run",
        str(SCALAR),
        "--run-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "4",
        "--callback",
        "say_step:every=2,prefix=reached",
    )
    assert ran.returncode == 0, ran.stderr
    assert "reached step 2" in ran.stdout and "reached step 4" in ran.stdout
    wrong = baton("run", str(SCALAR), "--run-dir", str(tmp_path), "--callback", "say_step:every=x")
    assert wrong.returncode == 2 and "every is 'x', not a whole number" in wrong.stderr


def test_help_lists_the_callback_flags_without_importing_a_framework(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        from baton.core.cli.command import main
        code = main(["run", {str(ROOT / "recipes" / "quickstart.py")!r}, "--help"])
        assert code == 0, code
        assert "torch" not in sys.modules and "jax" not in sys.modules
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    for flag in ("--callback", "--no-callback", "--console-keys"):
        assert flag in out.stdout


def test_every_registered_callback_documents_its_arguments() -> None:
    """``baton callbacks NAME`` (and the docs' callback pages) read each argument's help
    from the class docstring's ``Args:``: none may be missing."""
    from baton.core.cli.callback_flags import callback_signature
    from baton.core.registry import CALLBACKS

    missing = [
        f"{name}.{param.name}"
        for name, cls in CALLBACKS.items()
        for param in callback_signature(cls).params
        if not param.help
    ]
    assert not missing, f"add them to the class docstring's Args: section: {missing}"


def test_dropping_a_callback_the_recipe_lacks_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging()  # as `baton run` does: baton's lines on stdout
    driver = build_driver(SCALAR, ["--run-dir", str(tmp_path), "--no-callback", "progress"])
    assert driver is not None and len(driver.callbacks) == 2  # the recipe's, unchanged
    captured = capsys.readouterr()
    assert (
        "--no-callback progress: the recipe adds no progress callback"
        in captured.err + captured.out
    )
