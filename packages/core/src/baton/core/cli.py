"""The ``baton`` command: run recipes and list what is registered.

baton run recipes/quickstart.py --max-steps 50 --resume auto
baton callbacks
baton backends
baton patches --backend torchtitan
baton plot runs/quickstart
baton data prepare corpus.jsonl --tokenizer runs/tok --output data/corpus
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from baton.core.registry import BACKENDS, CALLBACKS


def _doc_line(obj: object) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def _setup_logging() -> None:
    handler = RichHandler(show_path=False, markup=False, rich_tracebacks=False)
    logging.getLogger("baton").handlers[:] = [handler]
    logging.getLogger("baton").setLevel(logging.INFO)
    logging.getLogger("baton").propagate = False


def cmd_run(argv: Sequence[str]) -> int:
    from baton.core.recipe import RecipeError, build_driver

    if not argv or argv[0].startswith("-"):
        print(
            "usage: baton run RECIPE.py [--param value ...] [--resume auto] [--help]",
            file=sys.stderr,
        )
        return 2
    _setup_logging()
    try:
        driver = build_driver(argv[0], argv[1:])
    except RecipeError as error:
        print(f"baton: {error}", file=sys.stderr)
        return 2
    if driver is None:
        return 0
    result = driver.fit()
    Console(stderr=True).print(
        f"[bold]done[/]: step {result.step}, {result.tokens:,} tokens, "
        f"{result.train_time_s:.1f} s ({result.stop_reason}); run dir {driver.run_dir}"
    )
    return 0


def _table(*columns: str) -> Table:
    """A listing whose first column (the name people type) never wraps or truncates."""
    table = Table(*columns)
    table.columns[0].no_wrap = True
    return table


def _print(table: Table) -> None:
    console = Console()
    if not console.is_terminal:
        console.width = 160
    console.print(table)


def cmd_callbacks(argv: Sequence[str]) -> int:
    table = _table("callback", "class", "what it does")
    for name, cls in CALLBACKS.items():
        table.add_row(name, cls.__qualname__, _doc_line(cls))
    _print(table)
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
    table = _table("patch", "backend", "versions", "phase", "what it fixes")
    for cls in rows:
        table.add_row(cls.name, cls.backend, cls.versions or "any", cls.phase, cls.summary())
    _print(table)
    return 0


#: commands that are tools, in other distributions: name -> (module, what installs it).
#: Each module has ``main(argv) -> int`` and is imported only when its command runs.
TOOL_COMMANDS: dict[str, tuple[str, str]] = {
    "plot": ("baton.tools.plot", "baton-tools"),
    "data": ("baton.tools.data", "baton-tools[data]"),
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
    "callbacks": cmd_callbacks,
    "backends": cmd_backends,
    "patches": cmd_patches,
    **{name: _tool_command(name) for name in TOOL_COMMANDS},
}


def main(argv: Sequence[str] | None = None) -> int:
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
    return command(args[1:])


if __name__ == "__main__":
    sys.exit(main())
