"""Recipes: Python files whose ``recipe`` function returns a configured ``Driver``.

The function's typed parameters are the experiment's settings; ``baton run`` turns
them into a command line (``--max-steps 50 --lr 3e-4``) with tyro, so ``--help``
lists them with defaults and a bad value is rejected with the parameter's name.

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
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import tyro
import yaml

from baton.core.overrides import OverrideError, apply_overrides
from baton.core.recipe_signature import Signature, read_signature, signature_of

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
    config: str | None = None
    """YAML or TOML file of parameter values; flags given here override it."""
    print_config: bool = False
    """Print the resolved parameters (YAML) and exit without training."""
    set: tuple[str, ...] = ()
    """Override a field of the backend's native config, KEY.PATH=VALUE (repeatable)."""


_RUN_OPTION_HELP = {
    "resume": "'auto' (newest complete checkpoint), 'none', or a checkpoint directory",
    "patches": "patch selection: 'all', 'none', 'a,b' or 'all,-a' (default: $BATON_PATCHES or all)",
    "config": "YAML or TOML file of parameter values; flags given here override it",
    "print_config": "print the resolved parameters (YAML) and exit without training",
    "set": "override a field of the backend's native config: --set KEY.PATH=VALUE (repeatable)",
}


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


def recipe_arguments(
    recipe: Callable[..., Any] | Signature, defaults: dict[str, Any] | None = None
) -> type:
    """A dataclass whose fields are the recipe's parameters plus the ``RunOptions``;
    ``defaults`` (a ``--config`` file's values) replace the recipe's own defaults."""
    signature = recipe if isinstance(recipe, Signature) else signature_of(recipe)
    defaults = defaults or {}
    fields: list[tuple[str, Any, Any]] = []
    own = set()
    for param in signature.params:
        default = defaults.get(param.name, param.default)
        annotated = Annotated[param.annotation, tyro.conf.arg(help=param.help or None)]
        fields.append((param.name, annotated, dataclasses.field(default=default)))
        own.add(param.name)
    for f in dataclasses.fields(RunOptions):
        if f.name not in own:
            kind: Any = f.type if f.name != "set" else tuple[str, ...]
            if f.name == "set":
                kind = Annotated[kind, tyro.conf.UseAppendAction]
            annotated = Annotated[kind, tyro.conf.arg(help=_RUN_OPTION_HELP[f.name])]
            fields.append(
                (f.name, annotated, dataclasses.field(default=defaults.get(f.name, f.default)))
            )
    # required parameters first, as dataclasses demand
    fields.sort(key=lambda item: item[2].default is not dataclasses.MISSING)
    return dataclasses.make_dataclass("RecipeArguments", fields)


def read_config_file(path: str | Path, known: set[str]) -> dict[str, Any]:
    """Parameter values from a YAML or TOML file; unknown names are an error."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"--config {path}: no such file")
    try:
        if path.suffix == ".toml":
            values = tomllib.loads(path.read_text())
        elif path.suffix in (".yaml", ".yml"):
            values = yaml.safe_load(path.read_text()) or {}
        else:
            raise RecipeError(f"--config {path}: use a .yaml, .yml or .toml file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError) as error:
        first = str(error).splitlines()[0]
        raise RecipeError(f"--config {path} does not parse: {first}") from None
    if not isinstance(values, dict):
        raise RecipeError(f"--config {path}: expected a table of name: value pairs")
    values = {str(k).replace("-", "_"): v for k, v in values.items()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise RecipeError(
            f"--config {path}: unknown parameters {unknown}; the recipe takes: "
            + ", ".join(sorted(known))
        )
    return values


def _config_path(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def parse_recipe_args(
    recipe: Callable[..., Any] | Signature, argv: Sequence[str], prog: str
) -> tuple[dict[str, Any], RunOptions]:
    """Parse ``argv`` against the recipe's signature; exits 2 with a message on bad input."""
    signature = recipe if isinstance(recipe, Signature) else signature_of(recipe)
    own = {p.name for p in signature.params}
    config = _config_path(argv)
    known = own | {f.name for f in dataclasses.fields(RunOptions)} - {"config", "print_config"}
    defaults = read_config_file(config, known) if config else {}
    args_cls = recipe_arguments(signature, defaults)
    parsed = tyro.cli(args_cls, args=list(argv), prog=prog, description=signature.summary)
    values = dataclasses.asdict(parsed)
    options = RunOptions(**{f.name: values[f.name] for f in dataclasses.fields(RunOptions)})
    kwargs = {k: v for k, v in values.items() if k in own}
    return kwargs, options


def build_driver(path: str | Path, argv: Sequence[str] = ()) -> Any:
    """Parse the flags (before the recipe imports anything heavy), call the recipe and
    return its ``Driver`` configured by the options; ``None`` when it printed and is done."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist (recipes live in recipes/*.py)")
    fn: Callable[..., Any] | None = None
    signature = read_signature(path)
    if signature is None:
        fn = load_recipe(path)
        signature = signature_of(fn)
    kwargs, options = parse_recipe_args(signature, argv, prog=f"baton run {path}")
    if options.print_config:
        resolved = {**kwargs, "resume": options.resume, "patches": options.patches}
        if options.set:
            resolved["set"] = list(options.set)
        print(yaml.safe_dump(_jsonable(resolved), sort_keys=False), end="")
        return None
    driver = (fn or load_recipe(path))(**kwargs)
    if driver is None:
        return None
    if "resume" not in kwargs:
        driver.resume = options.resume
    if "patches" not in kwargs:
        driver.patch_selection = options.patches
    if options.set:
        try:
            applied = apply_overrides(driver.backend.config, options.set)
        except OverrideError as error:
            raise RecipeError(str(error)) from None
        driver.settings["set"] = _jsonable(applied)
    driver.settings.update({k: _jsonable(v) for k, v in kwargs.items()})
    driver.settings.setdefault("recipe", str(path))
    return driver


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)
