"""A user's own callback class, named by file or module on ``baton run``'s command line
or in a config file: typed from its signature, recorded in ``run.json`` and in each
checkpoint, rebuilt by ``--resume auto``, its arguments compared like the run's other
settings; and the errors of a bad class path, an unknown config key or a broken plugin.

Every run here is the real ``baton run`` over the scalar test backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.core import registry
from baton.core.cli.command import main
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
SCALAR = ROOT / "tests" / "safety" / "recipe_scalar.py"

MY_CALLBACKS = '''
import json

from baton.core import Callback


class EmbedNorm(Callback):
    """Counts the steps it saw and writes them, with its scale, into the run directory.

    Args:
        scale: a number the run is configured with.
        label: a word written beside it.
    """

    state_key = "embed_norm"

    def __init__(self, scale: float = 1.0, label: str = "norm") -> None:
        self.scale = scale
        self.label = label
        self.steps = 0

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]

    def on_step_end(self, driver, output) -> None:
        self.steps += 1

    def on_train_end(self, driver) -> None:
        seen = {"scale": self.scale, "label": self.label, "steps": self.steps, "at": driver.step}
        (driver.options.run_dir / "embed_norm.json").write_text(json.dumps(seen))


class NotACallback:
    pass
'''


def baton(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``baton ARGS`` in this process: its exit status and everything it printed."""
    capsys.readouterr()
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.fixture
def my_callbacks(tmp_path: Path) -> Path:
    path = tmp_path / "my_callbacks.py"
    path.write_text(MY_CALLBACKS)
    return path


@pytest.fixture(autouse=True)
def plain_baton_logger():
    """``baton run`` points the ``baton`` logger at the console; put it back after."""
    import logging

    logger = logging.getLogger("baton")
    yield
    logger.handlers[:] = []
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


def written(run_dir: Path) -> dict[str, object]:
    return json.loads((run_dir / "embed_norm.json").read_text())


def newest_meta(run_dir: Path) -> dict[str, object]:
    return json.loads((run_dir / "checkpoints" / "latest" / "baton.json").read_text())


def test_a_callback_from_a_file_is_recorded_and_resumed(
    tmp_path: Path, my_callbacks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    run = ["run", str(SCALAR), "--run-dir", str(run_dir)]
    given = f"{my_callbacks}:EmbedNorm:scale=2,label=first"
    status, out = baton(capsys, *run, "--max-steps", "3", "--callback", given)
    assert status == 0, out
    assert written(run_dir) == {"scale": 2.0, "label": "first", "steps": 3, "at": 3}
    recorded = {"name": f"{my_callbacks}:EmbedNorm", "scale": 2.0, "label": "first"}
    assert json.loads((run_dir / "run.json").read_text())["settings"]["callbacks"] == [recorded]
    meta = newest_meta(run_dir)
    assert meta["settings"]["callbacks"] == [recorded]  # type: ignore[index]
    assert meta["callbacks"]["embed_norm"] == {"steps": 3}  # type: ignore[index]

    # --resume auto rebuilds it from the checkpoint's record, and gives it its state
    more = ("--max-steps", "6", "--allow-changed", "max_steps")
    status, out = baton(capsys, *run, "--resume", "auto", *more)
    assert status == 0, out
    assert "resuming with the callbacks the checkpoint's run added: EmbedNorm" in out
    assert written(run_dir) == {"scale": 2.0, "label": "first", "steps": 6, "at": 6}

    # a changed argument is refused before anything is built, naming how to allow it
    changed = f"{my_callbacks}:EmbedNorm:scale=3,label=first"
    status, out = baton(capsys, *run, "--resume", "auto", "--callback", changed, *more)
    assert status == 2
    assert "would change EmbedNorm.scale (2.0 -> 3.0)" in out
    assert "--allow-changed EmbedNorm.scale" in out
    assert written(run_dir)["steps"] == 6  # nothing ran

    allowed = ("--max-steps", "8", "--allow-changed", "max_steps,EmbedNorm.scale")
    status, out = baton(capsys, *run, "--resume", "auto", "--callback", changed, *allowed)
    assert status == 0, out
    assert "resuming with EmbedNorm.scale changed from 2.0 to 3.0" in out
    assert written(run_dir) == {"scale": 3.0, "label": "first", "steps": 8, "at": 8}
    changes = newest_meta(run_dir)["resume_changes"]
    assert changes[-1]["changes"]["EmbedNorm.scale"] == {  # type: ignore[index]
        "checkpoint": 2.0,
        "now": 3.0,
        "applied_by": "callback",
    }


def test_dropping_or_adding_a_stateful_callback_on_resume_is_said(
    tmp_path: Path, my_callbacks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    run = ["run", str(SCALAR), "--run-dir", str(run_dir)]
    more = ("--allow-changed", "max_steps", "--resume", "auto")
    status, out = baton(capsys, *run, "--max-steps", "3")
    assert status == 0, out
    target = f"{my_callbacks}:EmbedNorm"
    status, out = baton(capsys, *run, "--max-steps", "4", *more, "--callback", target)
    assert status == 0, out
    assert "resuming with callback 'embed_norm', which the run of checkpoint" in out
    assert written(run_dir)["steps"] == 1  # from its initial state
    status, out = baton(capsys, *run, "--max-steps", "5", *more, "--no-callback", target)
    assert status == 0, out
    lines = [line for line in out.splitlines() if "resuming without callback" in line]
    assert len(lines) == 1 and "'embed_norm'" in lines[0] and "is not used" in lines[0]
    assert "nothing dropped" not in out  # the checkpoint's run had it: no recipe to blame
    # an evaluation of a checkpoint with the callback's state says nothing about it
    with_state = run_dir / "checkpoints" / "step_000004"
    assert "embed_norm" in json.loads((with_state / "baton.json").read_text())["callbacks"]
    status, out = baton(capsys, "eval", str(SCALAR), "--checkpoint", str(with_state))
    assert status == 0, out
    assert "eval/loss" in out and "callback" not in out


def test_a_class_named_by_module_and_a_config_files_class_path(
    tmp_path: Path, my_callbacks: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from baton.callbacks import Watchdog

    argv = ["--run-dir", str(tmp_path / "run")]
    for given in ("baton.callbacks.watchdog:Watchdog:timeout_s=7", "baton.callbacks.Watchdog"):
        driver = build_driver(SCALAR, [*argv, "--callback", given])
        assert driver is not None
        watchdog = [cb for cb in driver.callbacks if isinstance(cb, Watchdog)]
        assert len(watchdog) == 1
    config = tmp_path / "exp.yaml"
    config.write_text(
        f"callbacks:\n  - {my_callbacks}:EmbedNorm:scale=4\n"
        f"  - name: baton.callbacks.watchdog:Watchdog\n    timeout_s: 9\n"
    )
    driver = build_driver(SCALAR, [*argv, "--config", str(config)])
    assert driver is not None
    names = {type(cb).__name__: cb for cb in driver.callbacks}
    assert names["EmbedNorm"].scale == 4.0  # type: ignore[attr-defined]
    assert names["Watchdog"].timeout_s == 9.0  # type: ignore[attr-defined]
    toml = tmp_path / "exp.toml"
    toml.write_text(f'callbacks = ["{my_callbacks}:EmbedNorm:scale=5"]\n')
    driver = build_driver(SCALAR, [*argv, "--config", str(toml)])
    assert driver is not None
    assert [cb.scale for cb in driver.callbacks if type(cb).__name__ == "EmbedNorm"] == [5.0]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("missing.py:EmbedNorm", "callback file {dir}/missing.py does not exist"),
        ("{file}:EmbedNrom", "defines no class 'EmbedNrom'; did you mean 'EmbedNorm'?"),
        ("{file}:NotACallback", "NotACallback is not a baton Callback; make it a subclass"),
        ("{file}", "name the class in {file}, e.g. --callback {file}:MyCallback"),
        ("{file}:EmbedNorm:scale=big", "scale is 'big', not a number"),
        ("{file}:EmbedNorm:scal=2", "EmbedNorm has no argument 'scal'; did you mean 'scale'?"),
        ("nosuchpkg.callbacks:Thing", "no module named 'nosuchpkg.callbacks'; install"),
        ("nosuchpkg.Thing:x=1", "no module named 'nosuchpkg'; install the package"),
        ("baton.callbacks.watchdog:Watchdg", "did you mean 'Watchdog'?"),
    ],
)
def test_a_bad_class_path_is_one_line(
    tmp_path: Path,
    my_callbacks: Path,
    monkeypatch: pytest.MonkeyPatch,
    given: str,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    names = {"file": str(my_callbacks), "dir": str(tmp_path)}
    argv = ["--run-dir", str(tmp_path / "run"), "--callback", given.format(**names)]
    with pytest.raises(UsageError) as error:
        build_driver(SCALAR, argv)
    assert message.format(**names) in str(error.value)
    assert "\n" not in str(error.value) and error.value.exit_status == 2
    assert not (tmp_path / "run").exists()  # refused before the recipe ran


def test_an_unknown_config_key_gets_one_suggestion(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text("max_step: 4\n")
    with pytest.raises(UsageError) as error:
        build_driver(SCALAR, ["--run-dir", str(tmp_path), "--config", str(config)])
    assert str(error.value) == (
        f"--config {config}: unknown parameter 'max_step' (did you mean 'max_steps'?); "
        "fix the key in the file"
    )
    config.write_text("zzz: 4\n")
    with pytest.raises(UsageError, match=r"unknown parameters \['zzz'\]; the recipe takes: "):
        build_driver(SCALAR, ["--run-dir", str(tmp_path), "--config", str(config)])


def test_a_plugin_that_fails_to_import_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A distribution announcing a ``baton.plugins`` module that raises on import: every
    lookup says which plugin and why, instead of an unknown name."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "broken_plugin.py").write_text("import not_installed_dependency\n")
    info = site / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[baton.plugins]\nbroken = broken_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    status, out = baton(capsys, "run", str(SCALAR), "--run-dir", str(tmp_path), "--callback", "x")
    assert status == 2
    assert out == (
        "baton: baton plugin 'broken' (distribution broken-plugin) failed to import "
        "broken_plugin: ModuleNotFoundError: No module named 'not_installed_dependency'; fix "
        "or install what it needs, or uninstall it (pip uninstall broken-plugin)\n"
    )
    status, out = baton(capsys, "callbacks")  # every later lookup says it again
    assert status == 2 and "baton plugin 'broken'" in out


def test_a_registered_callbacks_changed_argument_is_refused_on_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same for a registered callback given by name (``ema:decay`` on a model run)."""
    run = ["run", str(SCALAR), "--run-dir", str(tmp_path / "run")]
    status, out = baton(capsys, *run, "--max-steps", "3", "--callback", "goodput:interval_s=2")
    assert status == 0, out
    resume = ("--resume", "auto", "--max-steps", "4", "--callback", "goodput:interval_s=5")
    status, out = baton(capsys, *run, *resume, "--allow-changed", "max_steps")
    assert status == 2 and "would change goodput.interval_s (2.0 -> 5.0)" in out
    status, out = baton(capsys, *run, *resume, "--allow-changed", "max_steps,goodput.interval_s")
    assert status == 0, out
    recorded = newest_meta(tmp_path / "run")["settings"]["callbacks"]  # type: ignore[index]
    assert [(r["name"], r["interval_s"]) for r in recorded] == [("goodput", 5.0)]


def test_a_class_of_a_top_level_module_on_pythonpath(tmp_path: Path, my_callbacks: Path) -> None:
    """``--callback my_callbacks:EmbedNorm`` with ``my_callbacks.py`` on ``PYTHONPATH`` (no
    package around it), as a user types it: the module's class, its arguments after it;
    the same in a config file and in ``baton callbacks``."""
    import os
    import subprocess
    import sys

    paths = [str(my_callbacks.parent), str(ROOT / "tests")]  # the recipe imports support/
    env = os.environ | {"PYTHONPATH": os.pathsep.join(paths)}

    def baton_process(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "baton.core.cli.command", *args],
            capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
        )  # fmt: skip

    run_dir = tmp_path / "run"
    result = baton_process(
        "run", str(SCALAR), "--run-dir", str(run_dir), "--max-steps", "2",
        "--callback", "my_callbacks:EmbedNorm:scale=3",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert written(run_dir) == {"scale": 3.0, "label": "norm", "steps": 2, "at": 2}
    recorded = json.loads((run_dir / "run.json").read_text())["settings"]["callbacks"]
    assert recorded == [{"name": "my_callbacks:EmbedNorm", "scale": 3.0, "label": "norm"}]

    config = tmp_path / "exp.yaml"
    config.write_text("callbacks:\n  - my_callbacks:EmbedNorm\n  - name: my_callbacks:EmbedNorm\n"
                      "    label: from-config\n")  # fmt: skip
    again = tmp_path / "again"
    result = baton_process("run", str(SCALAR), "--run-dir", str(again), "--max-steps", "1",
                           "--config", str(config))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert written(again)["label"] == "from-config"

    result = baton_process("callbacks", "my_callbacks:EmbedNorm")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("my_callbacks:EmbedNorm (my_callbacks:EmbedNorm): Counts")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "watchdog:Watchdog",
            "--callback watchdog:Watchdog: 'watchdog' is a registered callback and 'Watchdog' "
            "is not key=value; for the registered callback write --callback "
            "watchdog:key=value, for the class Watchdog of a module watchdog write "
            "--callback watchdog.Watchdog",
        ),
        (
            "watchdg:Watchdog",
            "no module named 'watchdg' (the registered callback 'watchdog'?); install the "
            "package that provides it, put its file on PYTHONPATH, or give a file: "
            "--callback path/to/file.py:Watchdog",
        ),
    ],
)
def test_a_module_and_class_that_could_be_a_callback_says_how_to_write_it(
    tmp_path: Path, given: str, message: str
) -> None:
    with pytest.raises(UsageError) as error:
        build_driver(SCALAR, ["--run-dir", str(tmp_path / "run"), "--callback", given])
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()
