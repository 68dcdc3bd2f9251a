"""Recipes: Python files whose ``recipe`` function returns a configured ``Driver``.

The function's typed parameters are the experiment's settings; ``baton run`` turns
them into a command line (``--max-steps 50 --lr 3e-4``) with tyro, so ``--help``
lists them with defaults and a bad value is rejected with the parameter's name.

Parameters whose meaning is in ``baton.core.cli.vocabulary`` take its names (``batch_size``,
``tp``, ``save_every``, ...), the same on every backend, and its bounds.
Numbers are checked before the recipe runs: counts and sizes (``batch_size``,
``seq_len``, ``n_*``, ``d_model``) and learning rates must be positive, step limits
and cadences (``max_*``, ``*_steps``, ``*_every``) not negative;
``Annotated[int, AtLeast(2)]`` sets another bound for one parameter.

Every recipe also takes the run's flags (``RecipeFlags``): ``--resume``, ``--config``,
``--set``, and the callbacks' (``baton.core.cli.callback_flags``): ``--callback
NAME:key=value``, ``--no-callback NAME``, ``--console-keys``.

Example ``recipes/tiny.py``::

    from baton.core import Driver
    from baton.backends.fabric.models.gpt import GPTTraining

    def recipe(max_steps: int = 100, lr: float = 3e-4) -> Driver:
        '''Train a tiny GPT.'''
        return Driver(GPTTraining(lr=lr).backend(), max_steps=max_steps)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import re
import sys
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, cast

__all__ = [
    "RecipeError",  # kept importable from here: recipes raise it
    "RecipeFlags",
    "build_driver",
    "load_recipe",
    "parse_recipe_args",
    "read_config_file",
    "recipe_arguments",
]

import tyro
import yaml

from baton.core.callback import Callback
from baton.core.callback_paths import class_label
from baton.core.checkpoints.resuming import planned_settings
from baton.core.cli.callback_flags import CallbackChoice, CallbackFlags, build_callback
from baton.core.cli.config_values import conform
from baton.core.cli.console_line import apply_console_keys
from baton.core.cli.dry_run import plan, planning
from baton.core.cli.objective_flags import expand, fold, load_named_objectives
from baton.core.cli.overrides import OverrideError, apply_overrides
from baton.core.cli.recipe_signature import AtLeast, Signature, read_signature, signature_of
from baton.core.cli.vocabulary import TERMS
from baton.core.driver import Driver
from baton.core.errors import RecipeError, UsageError, did_you_mean
from baton.core.json_values import json_value
from baton.core.logs import setup_logging

log = logging.getLogger("baton")

RECIPE_FUNCTION = "recipe"

#: numeric recipe parameters that must be > 0 (counts, sizes, learning rates)
POSITIVE = re.compile(r"^(n_.+|.+_(size|len|length|layers|heads|dim)|d_model|lr|learning_rate)$")
#: numeric recipe parameters that must be >= 0 (limits, step counts, cadences: 0 is "off")
NON_NEGATIVE = re.compile(r"^(max_.+|min_.+|.+_steps|.+_tokens|.+_every|seed|.+_ms)$")
#: (lower, upper) parameter pairs whose values must be ordered, as the frameworks assert
#: (Megatron-Core's scheduler asserts ``min_lr <= max_lr``)
ORDERED = (("min_lr", "lr"),)


def _flag(
    default: Any,
    help: str,
    *,
    run_option: bool = False,
    repeatable: bool = False,
    in_config_file: bool = True,
) -> Any:
    """A ``RecipeFlags`` field, the one place a run flag is described: its default, its
    ``--help`` text, whether the driver's ``RunOptions`` field of the same name takes its
    value (``run_option``), whether it is given once per item (``repeatable``) and
    whether a ``--config`` file may set it."""
    metadata = {
        "help": help,
        "run_option": run_option,
        "repeatable": repeatable,
        "in_config_file": in_config_file,
    }
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class RecipeFlags:
    """Flags every recipe gets from ``baton run`` (beside its own parameters), in one
    table: each field's ``metadata`` (``_flag``) holds its ``--help`` text and its kind,
    and every list of flag names is read from it. The ones marked ``run_option``
    replace the returned driver's ``RunOptions`` fields of the same name."""

    resume: str = _flag(
        "none",
        "'auto' (latest valid checkpoint), 'none', or a checkpoint directory",
        run_option=True,
    )
    patches: str | None = _flag(
        None,
        "patch selection: 'all', 'none', 'a,b' or 'all,-a' (default: $BATON_PATCHES or all)",
        run_option=True,
    )
    overwrite: bool = _flag(
        False,
        "start fresh where checkpoints exist: move the old checkpoints and logs aside",
        run_option=True,
    )
    allow_changed: str = _flag(
        "",
        "training settings that may differ from the checkpoint's on resume: 'lr,max_steps'",
        run_option=True,
    )
    verify: str = _flag(
        "full",
        "checkpoint check on resume: 'full' (checksums) or 'size' (sizes only; huge ones)",
        run_option=True,
    )
    checkpoint_upload: str | None = _flag(
        None,
        "also keep checkpoints in object storage, uploaded in the background "
        "and resumed from with --resume auto: 's3://bucket/prefix'",
        run_option=True,
    )
    config: str | None = _flag(
        None,
        "YAML or TOML file of parameter values; flags given here override it",
        in_config_file=False,
    )
    print_config: bool = _flag(
        False,
        "print the resolved parameters (YAML) and exit without training",
        in_config_file=False,
    )
    set: tuple[str, ...] = _flag(
        (),
        "override a field of the backend's native config: --set KEY.PATH=VALUE",
        repeatable=True,
    )
    callback: tuple[str, ...] = _flag(
        (),
        "add a callback, or configure the recipe's: NAME[:key=value,...] by registered "
        "name (`baton callbacks NAME` lists its arguments), or a class of your own: "
        "FILE.py:Class[:key=value,...] or MODULE:Class[:key=value,...]",
        repeatable=True,
    )
    no_callback: tuple[str, ...] = _flag(
        (),
        "drop a callback the recipe adds, by its registered name or class path",
        repeatable=True,
    )
    console_keys: str | None = _flag(
        None,
        "keys of the console line: 'loss,lr' (exactly these) or '+my/metric' "
        "(added to the recipe's)",
    )
    dry_run: bool = _flag(
        False,
        "check the run's parallel layout and print its plan, without training "
        "(backends with the dry_run ability: torchtitan, megatron, maxtext)",
    )
    world_size: int | None = _flag(
        None, "ranks (devices) --dry-run plans for (default: $WORLD_SIZE, else 8)"
    )
    verbose: bool = _flag(
        False, "print baton's detail lines too: each patch applied or skipped and why"
    )


def _flags_marked(mark: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(RecipeFlags) if f.metadata[mark])


#: flags given more than once, each adding an item
_REPEATABLE = _flags_marked("repeatable")
#: flags whose value replaces the driver's ``RunOptions`` field of the same name
RUN_OPTION_FLAGS = _flags_marked("run_option")
#: flags a ``--config`` file may set (all but the ones naming or printing it)
_CONFIG_FILE_FLAGS = _flags_marked("in_config_file")
#: ``--config`` keys for the callback flags: ``callbacks:`` (a list) and ``no_callbacks:``
CONFIG_CALLBACKS = {"callbacks": "callback", "no_callbacks": "no_callback"}


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
    except RecipeError:  # says what is wrong itself (an @extends naming no file)
        raise
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


def recipe_arguments(
    recipe: Callable[..., Any] | Signature, defaults: dict[str, Any] | None = None
) -> type:
    """A dataclass whose fields are the recipe's parameters plus the ``RecipeFlags``;
    ``defaults`` (a ``--config`` file's values) replace the recipe's own defaults."""
    signature = recipe if isinstance(recipe, Signature) else signature_of(recipe)
    defaults = defaults or {}
    fields: list[tuple[str, Any, Any]] = []
    own: set[str] = set()
    for param in signature.params:
        default = defaults.get(param.name, param.default)
        annotated = Annotated[param.annotation, _flag_help(param.help)]
        fields.append((param.name, annotated, dataclasses.field(default=default)))
        own.add(param.name)
    for f in dataclasses.fields(RecipeFlags):
        if f.name not in own:
            kind: Any = f.type if f.name not in _REPEATABLE else tuple[str, ...]
            if f.name in _REPEATABLE:
                kind = Annotated[kind, tyro.conf.UseAppendAction]
            annotated = Annotated[kind, _flag_help(f.metadata["help"])]
            fields.append(
                (f.name, annotated, dataclasses.field(default=defaults.get(f.name, f.default)))
            )
    # required parameters first, as dataclasses demand
    fields.sort(key=lambda item: item[2].default is not dataclasses.MISSING)
    return dataclasses.make_dataclass("RecipeArguments", fields)


def _flag_help(text: str) -> Any:
    """A flag's help for tyro, which adds ``(default: ...)`` unless the text already
    says what the default is."""
    if "default:" in text.lower():
        return tyro.conf.arg(help=text, help_behavior_hint="")
    return tyro.conf.arg(help=text or None)


def read_config_file(path: str | Path, known: set[str]) -> dict[str, Any]:
    """Parameter values from a YAML or TOML file; unknown names are an error."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"--config {path}: no such file")
    values: Any
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
    table = cast(dict[Any, Any], values)
    values = {str(k).replace("-", "_"): v for k, v in table.items()}
    unknown = sorted(set(values) - known)
    close = {name: did_you_mean(name, known) for name in unknown}
    if unknown and all(close.values()):
        named = ", ".join(f"{name!r} (did you mean {close[name]!r}?)" for name in unknown)
        raise RecipeError(f"--config {path}: unknown parameter {named}; fix the key in the file")
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


def recorded_defaults(signature: Signature, recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe parameters a checkpoint recorded (its ``settings``), as the parameters'
    types take them; a value recorded only as text that no longer fits is left out."""
    defaults: dict[str, Any] = {}
    for param in signature.params:
        if param.name in recorded:
            try:
                defaults[param.name] = conform(
                    param.name, recorded[param.name], param.annotation, "checkpoint"
                )
            except RecipeError:
                continue
    return defaults


def parse_recipe_args(
    recipe: Callable[..., Any] | Signature,
    argv: Sequence[str],
    prog: str,
    recorded: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], RecipeFlags, CallbackFlags]:
    """Parse ``argv`` against the recipe's signature; exits 2 with a message on bad input.
    Returns the recipe's values, the run's flags and the callbacks added and dropped
    (the ``--config`` file's, then the command line's).

    ``recorded``: a checkpoint's settings, the defaults beneath a ``--config`` file's
    values and the flags (``baton eval`` rebuilds the run that wrote the checkpoint)."""
    signature = expand(recipe if isinstance(recipe, Signature) else signature_of(recipe))
    own = {p.name for p in signature.params}
    config = _config_path(argv)
    flags = set(_CONFIG_FILE_FLAGS)
    known = own | flags - {*CONFIG_CALLBACKS.values()} | {*CONFIG_CALLBACKS}
    defaults = recorded_defaults(signature, recorded or {})
    callbacks = CallbackFlags()
    if config:
        types = {p.name: p.annotation for p in signature.params}
        types |= {k: v for k, v in typing.get_type_hints(RecipeFlags).items() if k not in types}
        from_file = read_config_file(config, known)
        callbacks = CallbackFlags.from_config(
            from_file.pop("callbacks", None), from_file.pop("no_callbacks", None), config
        )
        defaults |= {k: conform(k, v, types[k], config) for k, v in from_file.items()}
    args_cls = recipe_arguments(signature, defaults)
    parsed = cast(
        Any,
        tyro.cli(args_cls, args=list(argv), prog=prog, description=help_paragraphs(signature)),
    )
    values: dict[str, Any] = dataclasses.asdict(parsed)
    options = RecipeFlags(**{f.name: values[f.name] for f in dataclasses.fields(RecipeFlags)})
    kwargs = {k: v for k, v in values.items() if k in own}
    check_recipe_values(signature, kwargs)
    callbacks = callbacks.with_flags(options.callback, options.no_callback)
    return kwargs, options, switch_off_dropped(signature, kwargs, callbacks)


def switch_off_dropped(
    signature: Signature, kwargs: dict[str, Any], callbacks: CallbackFlags
) -> CallbackFlags:
    """A dropped callback that the recipe adds through a switch of the same name
    (``--no-callback progress`` where the recipe takes ``progress: bool``) turns the
    switch off in ``kwargs``: the run's settings, ``run.json`` and ``--print-config``
    then read ``progress: false`` beside ``no_callbacks: [progress]``, not ``true``."""
    switches = {p.name for p in signature.params if p.annotation is bool}
    off = [n for n in callbacks.dropped if n in switches and kwargs.get(n) is True]
    if not off:
        return callbacks
    kwargs.update(dict.fromkeys(off, False))
    return dataclasses.replace(callbacks, switched_off=(*callbacks.switched_off, *off))


def help_paragraphs(signature: Signature) -> str:
    """The recipe's summary as ``--help`` shows it: each paragraph on one line (the
    terminal wraps it), a blank line before each paragraph that starts with a letter
    (tyro starts a new line before one that starts otherwise, ``--flag``, and would add
    a second blank line)."""
    paragraphs = [" ".join(p.split()) for p in signature.summary.split("\n\n")]
    text = ""
    for paragraph in filter(None, paragraphs):
        if text:
            text += "\n\n" if paragraph[0].isalpha() else "\n"
        text += paragraph
    return text


def check_recipe_values(signature: Signature, values: dict[str, Any]) -> None:
    """Reject out-of-range numbers (by ``AtLeast`` or the naming rules above) before the
    recipe builds anything."""
    annotations = {p.name: p.annotation for p in signature.params}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")
        metadata = getattr(annotations.get(name), "__metadata__", ())
        bounds = [m for m in metadata if isinstance(m, AtLeast)]
        term = TERMS.get(name)
        if bounds:
            if value < bounds[0].minimum:
                raise UsageError(f"{flag} must be >= {bounds[0].minimum:g}, got {value}")
        elif POSITIVE.match(name) and value <= 0:
            raise UsageError(f"{flag} must be > 0, got {value}")
        elif NON_NEGATIVE.match(name) and value < 0:
            raise UsageError(f"{flag} must be >= 0, got {value}")
        elif term is not None and term.minimum is not None and value < term.minimum:
            raise UsageError(f"{flag} must be >= {term.minimum:g}, got {value}")
    for lower, upper in ORDERED:
        low, high = values.get(lower), values.get(upper)
        if isinstance(low, int | float) and isinstance(high, int | float) and low > high:
            low_flag, high_flag = (f"--{n.replace('_', '-')}" for n in (lower, upper))
            raise UsageError(
                f"{low_flag} {low:g} is above {high_flag} {high:g}: it must be <= "
                f"{high_flag}; lower {low_flag} (or raise {high_flag})"
            )


def build_driver(
    path: str | Path, argv: Sequence[str] = (), *, recorded: Mapping[str, Any] | None = None
) -> Driver | None:
    """Parse the flags (before the recipe imports anything heavy), call the recipe and
    return its ``Driver`` configured by the options; ``None`` when it printed and is done
    (``--print-config``, or ``--dry-run``: the backend's plan, ``baton.core.cli.dry_run``).
    ``recorded``: settings a checkpoint recorded, the defaults beneath the flags."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist (recipes live in recipes/*.py)")
    fn: Callable[..., Any] | None = None
    signature = read_signature(path)
    if signature is None:
        fn = load_recipe(path)
        signature = signature_of(fn)
    argv = load_named_objectives(argv)  # --objective FILE.py:NAME: registered first
    signature = expand(signature)  # the objective's flags, from the declarations
    kwargs, options, callbacks = parse_recipe_args(signature, argv, f"baton run {path}", recorded)
    arguments = fold(kwargs, signature)  # an objective's settings checked here, before all
    if options.verbose:
        setup_logging(level=logging.DEBUG)
    added = callbacks.build()  # a bad name or argument stops here, before the recipe runs
    if options.print_config:
        print_config(kwargs, options, callbacks.settings_of(added))
        return None
    driver = call_recipe(path, fn, arguments, dry_run=options.dry_run)
    if driver is None:
        return None
    if not options.dry_run:
        resume = run_flags(options, kwargs).get("resume", driver.options.resume)
        callbacks, added = with_recorded_callbacks(
            callbacks, added, planned_settings(driver.options.run_dir, resume)
        )
    driver.callbacks = callbacks.apply(driver.callbacks, added)
    if options.console_keys is not None:
        apply_console_keys(driver.callbacks, options.console_keys)
    settings = dict(driver.options.settings)
    settings.update(callbacks.settings_of(added))
    if options.set:
        try:
            applied = apply_overrides(driver.backend.config, options.set)
        except OverrideError as error:
            raise RecipeError(str(error)) from None
        settings["set"] = json_value(applied)
    if options.dry_run:
        print(plan(driver.backend, options.world_size), flush=True)
        return None
    # a flag left unset that the recipe resolved (the tokenizer prepared data names) is
    # recorded as the recipe resolved it
    resolved = {k for k, v in kwargs.items() if v is None and settings.get(k) is not None}
    settings.update({k: json_value(v) for k, v in kwargs.items() if k not in resolved})
    settings.setdefault("recipe", str(path))
    driver.options = driver.options.replace(**run_flags(options, kwargs), settings=settings)
    return driver


def with_recorded_callbacks(
    callbacks: CallbackFlags,
    added: list[tuple[CallbackChoice, Callback]],
    recorded: Mapping[str, Any],
) -> tuple[CallbackFlags, list[tuple[CallbackChoice, Callback]]]:
    """A resume's callbacks: the ones the checkpoint's run added (``recorded``, its
    settings) rebuilt with their recorded arguments, where this run neither gives nor
    drops them, before this run's own."""
    callbacks, again = callbacks.with_recorded(recorded.get("callbacks"), "checkpoint settings")
    if not again:
        return callbacks, added
    log.info(
        "resuming with the callbacks the checkpoint's run added: %s",
        ", ".join(class_label(choice.name) for choice in again),
    )
    rebuilt = [(choice, build_callback(choice)) for choice in again]
    return callbacks, [*rebuilt, *added]


def print_config(
    kwargs: Mapping[str, Any], options: RecipeFlags, callbacks: Mapping[str, Any]
) -> None:
    """``--print-config``: the recipe's values, the run's flags and the callbacks added
    and dropped, resolved, as YAML a ``--config`` file reads back."""
    resolved = {
        **kwargs,
        **{
            k: v
            for k, v in dataclasses.asdict(options).items()
            if k not in ("config", "print_config", "set", *CONFIG_CALLBACKS.values())
        },
    }
    if options.set:
        resolved["set"] = list(options.set)
    resolved.update(callbacks)
    print(yaml.safe_dump(json_value(resolved), sort_keys=False), end="")


def call_recipe(
    path: Path, fn: Callable[..., Any] | None, kwargs: Mapping[str, Any], *, dry_run: bool
) -> Driver | None:
    """The recipe's ``Driver`` (``None`` if it returned none), loading the recipe if
    ``fn`` is not loaded yet; a recipe's ``ValueError``/``TypeError`` is bad input, and
    a return value that is not a ``Driver`` is the recipe's fault."""
    try:
        with planning(dry_run):
            driver = (fn or load_recipe(path))(**kwargs)
    except (ValueError, TypeError) as error:
        if isinstance(error, UsageError):
            raise
        raise UsageError(f"recipe {path}: {error}") from None
    if driver is not None and not isinstance(driver, Driver):
        raise RecipeError(
            f"{path}: {RECIPE_FUNCTION}() returned {type(driver).__name__}, not a Driver; "
            "end it with `return Driver(...)`"
        )
    return driver


def run_flags(options: RecipeFlags, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The run's flags the driver's options take, where the recipe does not take a
    parameter of that name itself."""
    return {k: getattr(options, k) for k in RUN_OPTION_FLAGS if k not in kwargs}
