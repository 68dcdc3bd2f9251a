"""Recipes: Python files whose ``recipe`` function returns a configured ``Driver``.

The function's typed parameters are the experiment's settings; ``baton run`` turns
them into a command line (``--max-steps 50 --lr 3e-4``) with tyro, so ``--help``
lists them with defaults and a bad value is rejected with the parameter's name.

Example ``recipes/tiny.py``::

    from baton.core import Driver
    from baton.backends.fabric.gpt import GPTTraining

    def recipe(max_steps: int = 100, lr: float = 3e-4) -> Driver:
        '''Train a tiny GPT.'''
        return Driver(GPTTraining(lr=lr).backend(), max_steps=max_steps)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tyro

RECIPE_FUNCTION = "recipe"


class RecipeError(RuntimeError):
    """The recipe file cannot be used; the message says why and what to change."""


@dataclasses.dataclass
class RunOptions:
    """Options every recipe gets from ``baton run``."""

    resume: str = "none"
    """'auto' (newest complete checkpoint), 'none', or a checkpoint directory."""
    patches: str | None = None
    """Patch selection: 'all', 'none', 'a,b' or 'all,-a' (default: $BATON_PATCHES or all)."""


def load_recipe(path: str | Path) -> Callable[..., Any]:
    """Import a recipe file and return its ``recipe`` function."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist (recipes live in recipes/*.py)")
    module_name = f"baton_recipe_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RecipeError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, RECIPE_FUNCTION, None)
    if not callable(fn):
        raise RecipeError(
            f"{path} defines no function named {RECIPE_FUNCTION!r}; add `def recipe(...) -> Driver`"
        )
    return fn


def recipe_arguments(fn: Callable[..., Any]) -> type:
    """A dataclass whose fields are the recipe's parameters plus the ``RunOptions``."""
    hints = typing.get_type_hints(fn)
    fields: list[tuple[str, Any, Any]] = []
    own = set()
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name not in hints:
            raise RecipeError(
                f"recipe parameter {param.name!r} needs a type annotation for the command line"
            )
        default = dataclasses.MISSING if param.default is param.empty else param.default
        fields.append((param.name, hints[param.name], dataclasses.field(default=default)))
        own.add(param.name)
    for f in dataclasses.fields(RunOptions):
        if f.name not in own:
            fields.append((f.name, f.type, dataclasses.field(default=f.default)))
    # required parameters first, as dataclasses demand
    fields.sort(key=lambda item: item[2].default is not dataclasses.MISSING)
    return dataclasses.make_dataclass("RecipeArguments", fields)


def parse_recipe_args(
    fn: Callable[..., Any], argv: Sequence[str], prog: str
) -> tuple[dict[str, Any], RunOptions]:
    """Parse ``argv`` against the recipe's signature; exits 2 with a message on bad input."""
    args_cls = recipe_arguments(fn)
    description = inspect.getdoc(fn) or ""
    parsed = tyro.cli(args_cls, args=list(argv), prog=prog, description=description)
    values = dataclasses.asdict(parsed)
    own = set(inspect.signature(fn).parameters)
    options = RunOptions(**{f.name: values[f.name] for f in dataclasses.fields(RunOptions)})
    kwargs = {k: v for k, v in values.items() if k in own}
    return kwargs, options


def build_driver(path: str | Path, argv: Sequence[str] = ()) -> Any:
    """Load, parse and call a recipe; returns its ``Driver`` configured by the options."""
    fn = load_recipe(path)
    kwargs, options = parse_recipe_args(fn, argv, prog=f"baton run {path}")
    driver = fn(**kwargs)
    if driver is None:
        return None
    if "resume" not in kwargs:
        driver.resume = options.resume
    if "patches" not in kwargs:
        driver.patch_selection = options.patches
    driver.settings.update({k: _jsonable(v) for k, v in kwargs.items()})
    driver.settings.setdefault("recipe", str(path))
    return driver


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)
