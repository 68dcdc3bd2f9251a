"""Recipes: Python files whose ``recipe`` function returns a configured ``Driver``.

The function's typed parameters are the experiment's settings; ``baton run`` turns
them into a command line (``--max-steps 50 --lr 3e-4``) with tyro, so ``--help``
lists them with defaults and a bad value is rejected with the parameter's name.

Numbers are checked before the recipe runs: counts and sizes (``batch_size``,
``seq_len``, ``n_*``, ``d_model``) and learning rates must be positive, step limits
and cadences (``max_*``, ``*_steps``, ``*_every``) not negative;
``Annotated[int, AtLeast(2)]`` sets another bound for one parameter.

Example ``recipes/tiny.py``::

    from baton.core import Driver
    from baton.backends.fabric import FabricBackend, GPTConfig

    def recipe(max_steps: int = 100, lr: float = 3e-4) -> Driver:
        '''Train a tiny GPT.'''
        return Driver(FabricBackend(model=GPTConfig(), lr=lr), max_steps=max_steps)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import re
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tyro

from baton.core.errors import UsageError

RECIPE_FUNCTION = "recipe"

#: numeric recipe parameters that must be > 0 (counts, sizes, learning rates)
POSITIVE = re.compile(r"^(n_.+|.+_(size|len|length|layers|heads|dim)|d_model|lr|learning_rate)$")
#: numeric recipe parameters that must be >= 0 (limits, step counts, cadences: 0 is "off")
NON_NEGATIVE = re.compile(r"^(max_.+|.+_steps|.+_tokens|.+_every|seed|.+_ms)$")


class RecipeError(UsageError):
    """The recipe file cannot be used; the message says why and what to change."""


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """``Annotated[int, AtLeast(1)]``: the parameter's lowest accepted value."""

    minimum: float


@dataclasses.dataclass
class RunOptions:
    """Options every recipe gets from ``baton run``."""

    resume: str = "none"
    """'auto' (latest valid checkpoint), 'none', or a checkpoint directory."""
    patches: str | None = None
    """Patch selection: 'all', 'none', 'a,b' or 'all,-a' (default: $BATON_PATCHES or all)."""
    overwrite: bool = False
    """Start fresh where checkpoints exist: move the old checkpoints and logs aside."""
    allow_changed: str = ""
    """Training settings that may differ from the checkpoint's on resume: 'lr,max_steps'."""
    verify: str = "full"
    """Checkpoint check on resume: 'full' (checksums) or 'size' (sizes only; huge ones)."""


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
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise RecipeError(
            f"{path}:{error.lineno}: syntax error ({error.msg}); fix the recipe file"
        ) from None
    except ImportError as error:
        raise RecipeError(
            f"{path} cannot be imported: {error}; install what it needs (`uv sync`) or fix "
            "the import"
        ) from None
    except Exception as error:
        raise RecipeError(
            f"{path} raised {type(error).__name__} while loading: {error}; fix the recipe file"
        ) from None
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
    check_recipe_values(fn, kwargs)
    return kwargs, options


def check_recipe_values(fn: Callable[..., Any], values: dict[str, Any]) -> None:
    """Reject out-of-range numbers (by ``AtLeast`` or the naming rules above) before the
    recipe builds anything."""
    hints = typing.get_type_hints(fn, include_extras=True)
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")
        bounds = [m for m in getattr(hints.get(name), "__metadata__", ()) if isinstance(m, AtLeast)]
        if bounds:
            if value < bounds[0].minimum:
                raise UsageError(f"{flag} must be >= {bounds[0].minimum:g}, got {value}")
        elif POSITIVE.match(name) and value <= 0:
            raise UsageError(f"{flag} must be > 0, got {value}")
        elif NON_NEGATIVE.match(name) and value < 0:
            raise UsageError(f"{flag} must be >= 0, got {value}")


def build_driver(path: str | Path, argv: Sequence[str] = ()) -> Any:
    """Load, parse and call a recipe; returns its ``Driver`` configured by the options."""
    fn = load_recipe(path)
    kwargs, options = parse_recipe_args(fn, argv, prog=f"baton run {path}")
    try:
        driver = fn(**kwargs)
    except (ValueError, TypeError) as error:
        if isinstance(error, UsageError):
            raise
        raise UsageError(f"recipe {path}: {error}") from None
    if driver is None:
        return None
    if not all(hasattr(driver, a) for a in ("fit", "settings", "resume")):
        raise RecipeError(
            f"{path}: {RECIPE_FUNCTION}() returned {type(driver).__name__}, not a Driver; "
            "end it with `return Driver(...)`"
        )
    if "resume" not in kwargs:
        driver.resume = options.resume
    if "patches" not in kwargs:
        driver.patch_selection = options.patches
    for option in ("overwrite", "allow_changed", "verify"):
        if option not in kwargs:
            setattr(driver, option, getattr(options, option))
    driver.settings.update({k: _jsonable(v) for k, v in kwargs.items()})
    driver.settings.setdefault("recipe", str(path))
    return driver


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)
