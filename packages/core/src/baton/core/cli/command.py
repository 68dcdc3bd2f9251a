"""The ``baton`` command: run recipes and list what is registered.

baton run recipes/quickstart.py --max-steps 50 --resume auto
baton eval recipes/quickstart.py --checkpoint runs/quickstart/checkpoints/latest
baton export runs/hf_finetune/checkpoints/latest --format hf exported/
baton generate runs/hf_finetune --prompt "def main(" --max-new-tokens 20
baton callbacks
baton rewards accuracy
baton backends
baton patches --backend torchtitan
baton plot runs/quickstart
baton goodput runs/quickstart
baton data prepare corpus.jsonl --tokenizer runs/tok --output data/corpus

A user error prints one line naming the problem and the fix and exits 2 (bad command,
recipe or settings) or 1 (the run failed); ``BATON_DEBUG=1`` adds the traceback. Under
torchrun the ranks that stop on the same error print it once (``rank_errors.py``).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shutil
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.table import Table

from baton.core.errors import BatonError
from baton.core.launch import Launch, LaunchError
from baton.core.logs import setup_logging
from baton.core.quiet import quiet_imports
from baton.core.registry import BACKENDS, CALLBACKS


def _doc_line(obj: object) -> str:
    """The docstring's first paragraph on one line (a summary may span lines)."""
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def _asks_help(argv: Sequence[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def cmd_run(argv: Sequence[str]) -> int:
    from baton.core.cli.recipe import build_driver

    if not argv or argv[0].startswith("-"):
        print(
            "usage: baton run RECIPE.py [--param value ...] [--resume auto] [--help]",
            file=sys.stderr,
        )
        return 2
    launch = Launch.from_env()
    setup_logging(launch)
    if not _asks_help(argv):  # (help stays fast: it imports no framework)
        quiet_imports()  # the recipe imports its framework next
    driver = build_driver(argv[0], argv[1:])
    if driver is None:
        return 0
    result = driver.fit()
    if launch.rank == 0:
        counted = f"{result.tokens:,} tokens" if result.tokens else f"{result.samples:,} samples"
        Console(stderr=True, soft_wrap=True).print(  # one line, however long the path
            f"[bold]done[/]: step {result.step}, {counted}, "
            f"{result.train_time_s:.1f} s ({result.stop_reason}); run dir {driver.options.run_dir}"
        )
    return 0


EVAL_USAGE = """usage: baton eval RECIPE.py --checkpoint CHECKPOINT_DIR [--param value ...]

Evaluate a checkpoint once, without training: the recipe builds the backend with the
settings the checkpoint recorded (model, data, ...; a flag overrides one), the
checkpoint's weights are loaded (verified like a resume) and the evaluation metrics are
printed and logged at the checkpoint's step into an evaluation record beside the run,
RUN_DIR/evals/<checkpoint>/ (evaluating again replaces it; the run's own logs are left
as they are). `--run-dir DIR` logs there instead.

  --checkpoint DIR   a checkpoint directory, e.g. runs/quickstart/checkpoints/latest
  RECIPE.py --help   the recipe's own flags"""


def checkpoint_run_dir(checkpoint: str | Path) -> Path:
    """The run directory a checkpoint belongs to: the parent of its ``checkpoints/``.

    >>> checkpoint_run_dir("runs/a/checkpoints/step_000100").as_posix()
    'runs/a'
    """
    from baton.core.checkpoints.files import run_dir_of

    path = Path(checkpoint)
    return run_dir_of(path) or path.parent


def eval_record_dir(checkpoint: str | Path) -> Path:
    """Where ``baton eval`` logs a checkpoint's evaluation: ``RUN_DIR/evals/<checkpoint>``
    (``latest`` named by the checkpoint it points at).

    >>> eval_record_dir("runs/a/checkpoints/step_000100").as_posix()
    'runs/a/evals/step_000100'
    """
    path = Path(checkpoint)
    name = path.resolve().name if path.is_symlink() else path.name
    return checkpoint_run_dir(checkpoint) / "evals" / name


def recorded_settings(checkpoint: str | Path) -> dict[str, Any]:
    """The recipe settings a checkpoint's ``baton.json`` recorded (none when unreadable:
    loading it then says what is wrong)."""
    import json

    from baton.core.checkpoints.files import META_FILE

    try:
        meta: Any = json.loads((Path(checkpoint) / META_FILE).read_text())
        settings: Any = meta["settings"]
    except (OSError, ValueError, TypeError, KeyError):
        return {}
    if not isinstance(settings, dict):
        return {}
    return {str(k): v for k, v in cast(dict[Any, Any], settings).items()}


def cmd_eval(argv: Sequence[str]) -> int:
    """``baton eval RECIPE --checkpoint PATH [--param value ...]``: evaluation only."""
    from baton.core.checkpoints.files import CheckpointError
    from baton.core.cli.recipe import build_driver

    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(EVAL_USAGE)
        return 0 if args else 2
    if "--checkpoint" in args[:-1] and not args[0].startswith("-"):
        at = args.index("--checkpoint")
        checkpoint = args[at + 1]
        del args[at : at + 2]
    elif any(a in ("-h", "--help") for a in args[1:]):
        checkpoint = ""  # the recipe's own help, printed by build_driver
    else:
        print(EVAL_USAGE.splitlines()[0], file=sys.stderr)
        print(
            "baton eval: --checkpoint CHECKPOINT_DIR is required (--help explains)", file=sys.stderr
        )
        return 2
    setup_logging()
    if not _asks_help(args):
        quiet_imports()
    # the run's own settings, flags over them; errors are reported by main()
    driver = build_driver(args[0], args[1:], recorded=recorded_settings(checkpoint))
    if driver is None:
        return 0
    if not any(a == "--run-dir" or a.startswith("--run-dir=") for a in args):
        # an evaluation record beside the run that wrote the checkpoint (its training
        # logs untouched), replacing an earlier evaluation of the same checkpoint
        record = eval_record_dir(checkpoint)
        shutil.rmtree(record / "logs", ignore_errors=True)
        driver.options = driver.options.replace(run_dir=record)
    try:
        metrics = driver.evaluate_checkpoint(checkpoint)
    except (CheckpointError, FileNotFoundError) as error:
        print(f"baton: cannot evaluate {checkpoint}: {error}", file=sys.stderr)
        return 2
    for name, value in sorted(metrics.items()):
        print(f"{name} {value:.6g}")
    return 0


def _table(*columns: str) -> Table:
    """A listing whose first column (the name people type) never wraps or truncates."""
    table = Table(*columns)
    table.columns[0].no_wrap = True
    return table


class _Console(Console):
    """rich's console, whose closed pipe (``| head``) ends the command as ``main`` ends
    any other (rich's own answer is ``SystemExit(1)``)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def _print(table: Table) -> None:
    console = _Console()
    if not console.is_terminal:
        console.width = 160
    console.print(table)


def cmd_callbacks(argv: Sequence[str]) -> int:
    """``baton callbacks``: the registered callbacks; ``baton callbacks NAME``: one
    callback's arguments (type, default, help) as ``--callback NAME:key=value`` takes them."""
    if argv and argv[0] in ("-h", "--help"):
        print("usage: baton callbacks [NAME]   (NAME: its arguments for --callback NAME:key=value)")
        return 0
    if argv:
        return _callback_arguments(argv[0])
    table = _table("callback", "class", "what it does")
    for name, cls in CALLBACKS.items():
        table.add_row(name, cls.__qualname__, _doc_line(cls))
    _print(table)
    return 0


def _callback_arguments(name: str) -> int:
    from baton.core.callback_paths import FILE_MODULE_PREFIX, normal_name
    from baton.core.cli.callback_flags import callback_class, callback_signature, describe_parameter
    from baton.core.cli.config_values import spelled_as_text

    cls = callback_class(normal_name(name, "baton callbacks"), "baton callbacks")
    # arguments only code can give (a rich Console) are no flags: left out
    params = [p for p in callback_signature(cls).params if spelled_as_text(p.annotation)]
    where = (
        inspect.getfile(cls) if cls.__module__.startswith(FILE_MODULE_PREFIX) else cls.__module__
    )
    print(f"{name} ({where}:{cls.__qualname__}): {_doc_line(cls)}")
    table = _table("argument", "type", "default", "what it sets")
    for param in params:
        table.add_row(param.name, *describe_parameter(param))
    if params:
        _print(table)
    else:
        print("takes no arguments")
    example = next(iter(params), None)
    if example is not None:
        print(f"use: baton run RECIPE.py --callback {name}:{example.name}=VALUE")
    return 0


def cmd_rewards(argv: Sequence[str]) -> int:
    """``baton rewards``: the registered reward functions (GRPO's ``--reward``); ``baton
    rewards NAME``: one's settings (type, default, help) as ``--reward NAME:key=value``
    takes them."""
    if argv and argv[0] in ("-h", "--help"):
        print("usage: baton rewards [NAME]   (NAME: its settings for --reward NAME:key=value)")
        return 0
    from baton.core.cli.reward_flags import registered_rewards

    if argv:
        return _reward_settings(argv[0])
    table = _table("reward", "function", "what it does")
    for name, function in registered_rewards():
        where = f"{function.__module__}:{function.__qualname__}"
        table.add_row(name, where, _doc_line(function))
    _print(table)
    return 0


def _reward_settings(name: str) -> int:
    from baton.core.callback_paths import normal_name
    from baton.core.cli.callback_flags import describe_parameter, settings_signature
    from baton.core.cli.reward_flags import reward_function

    function = reward_function(normal_name(name, "baton rewards"), "baton rewards")
    params = settings_signature(function).params
    print(f"{name} ({function.__module__}:{function.__qualname__}): {_doc_line(function)}")
    table = _table("setting", "type", "default", "what it sets")
    for param in params:
        table.add_row(param.name, *describe_parameter(param))
    if params:
        _print(table)
        print(f"use: baton run RECIPE.py --reward {name}:{params[0].name}=VALUE")
    else:
        print("takes no settings")
    return 0


def cmd_backends(argv: Sequence[str]) -> int:
    table = _table("backend", "class", "what it does")
    for name in BACKENDS.names():  # listed without importing torch, jax or the backends
        where, doc = BACKENDS.summary(name)
        table.add_row(name, where, doc)
    _print(table)
    return 0


def cmd_patches(argv: Sequence[str]) -> int:
    from baton.core.patches import PATCHES

    parser = argparse.ArgumentParser(prog="baton patches", description="List registered patches.")
    parser.add_argument("--backend", help="only this backend's patches")
    args = parser.parse_args(argv)
    rows = [cls for _, cls in PATCHES.items() if args.backend in (None, cls.backend)]
    if args.backend and args.backend not in {cls.backend for _, cls in PATCHES.items()} | set(
        BACKENDS.names()
    ):
        print(
            f"baton: unknown backend {args.backend!r}; backends: {', '.join(BACKENDS.names())}",
            file=sys.stderr,
        )
        return 2
    if not rows:
        which = f"backend {args.backend!r}" if args.backend else "no backend"
        print(f"{which} registers no patches: it runs as installed, nothing to fix")
        return 0
    table = _table("patch", "backend", "versions", "phase", "what it fixes")
    for cls in rows:
        table.add_row(cls.name, cls.backend, cls.versions or "any", cls.phase, cls.summary())
    _print(table)
    return 0


#: commands that are tools, in other distributions: name -> (module, what installs it).
#: Each module has ``main(argv) -> int`` and is imported only when its command runs.
TOOL_COMMANDS: dict[str, tuple[str, str]] = {
    "plot": ("baton.tools.plot", "baton-tools"),
    "goodput": ("baton.tools.goodput", "baton-tools"),
    "submit": ("baton.tools.submit", "baton-tools"),
    "export": ("baton.tools.export", "baton-tools"),
    "generate": ("baton.tools.generate", "baton-tools[export]"),
    "data": ("baton.tools.data", "baton-tools[data]"),
    "compare": ("baton.tools.compare", "baton-tools[data]"),
}


def _tool_command(name: str) -> Callable[[Sequence[str]], int]:
    module_name, distribution = TOOL_COMMANDS[name]

    def run(argv: Sequence[str]) -> int:
        import importlib

        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            print(
                f"baton: `baton {name}` needs {distribution} ({error}); "
                f"install it (`uv sync` in the workspace, or `pip install {distribution}`)",
                file=sys.stderr,
            )
            return 2
        return int(module.main(list(argv)))

    return run


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "run": cmd_run,
    "eval": cmd_eval,
    "callbacks": cmd_callbacks,
    "rewards": cmd_rewards,
    "backends": cmd_backends,
    "patches": cmd_patches,
    **{name: _tool_command(name) for name in TOOL_COMMANDS},
}


#: third-party warnings that say nothing to a baton user, each with the reason
QUIET_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    # torch.cuda imports pynvml on every start; the package name is torch's business
    ("The pynvml package is deprecated", FutureWarning),
    # Lightning notices `srun` on a SLURM login node; baton reads the launch itself
    ("The `srun` command is available on your system but is not used", UserWarning),
    # torchdata's StatefulDataLoader calls torch.set_vital, which torch deprecated
    ("'set_vital' is deprecated", UserWarning),
)


def quiet_third_party_warnings() -> None:
    """Filter the third-party noise in ``QUIET_WARNINGS`` from baton's output."""
    import warnings

    for message, category in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category)


def main(argv: Sequence[str] | None = None) -> int:
    quiet_third_party_warnings()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        print("commands: " + ", ".join(COMMANDS))
        return 0 if args else 2
    command = COMMANDS.get(args[0])
    if command is None:
        print(
            f"baton: unknown command {args[0]!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr
        )
        return 2
    try:
        return command(args[1:])
    except SystemExit as exit_:  # argument parsers exit after printing their message
        return exit_.code if isinstance(exit_.code, int) else 2
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `baton ... | head`: the reader has all it wanted
        return _reader_gone()
    except BatonError as error:
        return _report(str(error), error.exit_status)
    except LaunchError as error:
        return _report(f"{error}; fix the launch environment variables", 2)
    except Exception as error:
        return _report(f"run failed: {type(error).__name__}: {error}", 1, hint=True)


def _reader_gone() -> int:
    """End quietly when stdout's reader closed the pipe (``| head``): later writes, and
    the interpreter's last flush, go to ``/dev/null`` instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def _report(message: str, status: int, *, hint: bool = False) -> int:
    """Print a user error as one message (the traceback only with ``BATON_DEBUG=1``);
    under torchrun once, by the first rank that has it (``rank_errors.claim``)."""
    from baton.core.cli.rank_errors import claim

    debug = os.environ.get("BATON_DEBUG", "") not in ("", "0")
    if debug:
        traceback.print_exc()
    suffix = " (BATON_DEBUG=1 shows the traceback)" if hint and not debug else ""
    line = f"baton: {message}{suffix}"
    if claim(line):
        print(line, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
