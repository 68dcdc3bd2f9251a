"""A recipe's objective on the command line: ``--objective NAME`` and every declared
objective's settings as flags, read from the declarations (``baton.core.objectives``).

A recipe takes the objective as one parameter::

    def recipe(..., objective: ObjectiveRun | str = "pretrain") -> Driver:
        run = ObjectiveRun.of(objective)

``baton run`` expands that parameter into ``--objective`` (its choices the registered
objectives) and one flag per setting of any objective (``--dpo-beta``, ``--dpo-loss``,
``--reference``, ``--num-generations``, ...; a setting two objectives share is one
flag), parses, checks and records them like any parameter (``--config`` files,
``--print-config``, the settings in ``run.json``), and hands the recipe one
``ObjectiveRun`` built from ``--objective`` and its own settings. A setting of another
objective given a value other than its default is refused, naming the objective it
belongs to. A recipe that adds an objective's setting as a parameter of its own is
refused: the declaration is the one place a setting is named.

Example::

    signature = expand(read_signature(Path("recipes/hf_finetune.py")))
    kwargs = fold(signature_values, signature)     # kwargs["objective"]: an ObjectiveRun
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, cast

import tyro

from baton.core.callback_paths import PathKind, is_class_path, load_module, split_class_path
from baton.core.cli.recipe_signature import Param, Signature
from baton.core.errors import RecipeError, UsageError
from baton.core.objectives import OBJECTIVES, Objective, ObjectiveRun, Setting, register_objective

#: the recipe parameter that takes the objective
OBJECTIVE = "objective"
#: marks the ``--objective`` flag ``expand`` made (``Annotated[str, EXPANDED]``)
EXPANDED = "baton.objective"
#: an objective of the user's: ``--objective FILE.py:NAME`` or ``module:NAME``
OBJECTIVE_PATH = PathKind(
    "--objective",
    "objective",
    "sft",
    "declaration",
    "NAME",
    "mypkg.objectives:FOCAL",
    "my_objectives.py:FOCAL",
    OBJECTIVES,
)


def load_named_objectives(argv: Sequence[str]) -> list[str]:
    """``argv`` with an ``--objective FILE.py:NAME`` (or ``module:NAME``) replaced by the
    name of the ``Objective`` it declares, which is registered first, so its settings are
    flags like the shipped objectives'. ``UsageError`` for a path naming no objective."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--" + OBJECTIVE and i + 1 < len(out):
            out[i + 1] = _registered(out[i + 1])
        elif arg.startswith(f"--{OBJECTIVE}="):
            out[i] = f"--{OBJECTIVE}={_registered(arg.partition('=')[2])}"
    return out


def _registered(value: str) -> str:
    if not is_class_path(value, OBJECTIVE_PATH):
        return value
    source = f"--objective {value}"
    target, rest = split_class_path(value, source, OBJECTIVE_PATH)
    if rest.strip():
        raise UsageError(
            f"{source}: an objective takes no arguments here; give its settings as flags"
        )
    where, _, name = target.rpartition(":")
    found = getattr(load_module(target, source, OBJECTIVE_PATH), name, None)
    if not isinstance(found, Objective):
        raise UsageError(
            f"{source}: {where} defines no Objective named {name!r}; declare one there "
            "(baton.core.objectives.Objective) or name the one it declares"
        )
    if found.name not in OBJECTIVES or OBJECTIVES.get(found.name) is not found:
        try:
            register_objective(found)
        except ValueError as error:
            raise UsageError(f"{source}: {error}") from None
    return found.name


def takes_objective(param: Param) -> bool:
    """Whether ``param`` is a recipe's objective (annotated with ``ObjectiveRun``)."""
    annotation = param.annotation
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if annotation is ObjectiveRun:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return ObjectiveRun in typing.get_args(annotation)
    return False


def declared_settings(*, plugins: bool = True) -> dict[str, tuple[Setting, tuple[str, ...]]]:
    """Every registered objective's settings by name, with the objectives declaring each
    (``plugins=False``: baton's own objectives, without importing plugins)."""
    found: dict[str, tuple[Setting, tuple[str, ...]]] = {}
    for name in OBJECTIVES.names(plugins=plugins):
        for setting in OBJECTIVES.get(name).settings:
            owners = found[setting.name][1] if setting.name in found else ()
            found[setting.name] = (setting, (*owners, name))
    return found


def objective_help(default: str) -> str:
    """``--objective``'s help: each registered objective and its one-line summary."""
    listed = "; ".join(f"{name}: {OBJECTIVES.get(name).summary}" for name in OBJECTIVES.names())
    return f"what a step minimises (default: {default}). {listed}"


def expand(signature: Signature) -> Signature:
    """``signature`` with its objective parameter (if any) replaced by ``--objective`` and
    every declared setting; ``RecipeError`` for a recipe naming a setting itself."""
    if not any(takes_objective(p) for p in signature.params):
        return signature
    settings = declared_settings()
    own = [p.name for p in signature.params if p.name in settings]
    if own:
        raise RecipeError(
            f"recipe parameter {own[0]!r} is a setting of --objective "
            f"{', '.join(settings[own[0]][1])} (baton.core.objectives): drop the parameter; "
            f"the recipe's objective: ObjectiveRun | str parameter brings its flags"
        )
    params: list[Param] = []
    for param in signature.params:
        if not takes_objective(param):
            params.append(param)
            continue
        default = param.default if isinstance(param.default, str) else "pretrain"
        expanded = Annotated[str, EXPANDED]
        described = objective_help(default)
        help_text = f"{param.help} {described}" if param.help else described
        params.append(Param(param.name, expanded, default, help_text))
        for setting, owners in settings.values():
            annotation = setting.annotation
            if setting.repeatable:  # --reward a --reward b
                annotation = Annotated[annotation, tyro.conf.UseAppendAction]
            params.append(Param(setting.name, annotation, setting.default, _help(setting, owners)))
    return dataclasses.replace(signature, params=tuple(params))


def _help(setting: Setting, owners: tuple[str, ...]) -> str:
    return f"({', '.join(owners)}) {setting.help}"


def fold(values: Mapping[str, Any], signature: Signature) -> dict[str, Any]:
    """The recipe's keyword arguments: ``values`` (parsed over the ``expand``-ed
    ``signature``) with the objective's settings folded into one ``ObjectiveRun``.
    ``UsageError`` for a setting of another objective given a non-default value."""
    if not any(_expanded(p) for p in signature.params):
        return dict(values)
    settings = declared_settings()
    kwargs = {k: v for k, v in values.items() if k not in settings}
    choice = OBJECTIVES.get(values[OBJECTIVE]) if values[OBJECTIVE] in OBJECTIVES else None
    if choice is None:
        ObjectiveRun.of(values[OBJECTIVE])  # the unknown name's error
        raise AssertionError("unreachable")
    own = {s.name for s in choice.settings}
    for name, (setting, owners) in settings.items():
        if name in own or name not in values:
            continue
        if _given(values[name], setting.default):
            raise UsageError(
                f"{setting.flag} is a setting of --objective {' and '.join(owners)}, not of "
                f"{choice.name}; drop it, or pass --objective {owners[0]}"
            )
    chosen = {name: _as_declared(values[name]) for name in own if name in values}
    kwargs[OBJECTIVE] = ObjectiveRun.of(choice, **chosen)
    return kwargs


def _expanded(param: Param) -> bool:
    """Whether ``param`` is the ``--objective`` that ``expand`` made of a recipe's
    ``ObjectiveRun`` parameter (a recipe's own ``objective: str`` is left as it is)."""
    return EXPANDED in getattr(param.annotation, "__metadata__", ())


def _given(value: Any, default: Any) -> bool:
    return _as_declared(value) != _as_declared(default)


def _as_declared(value: Any) -> Any:
    """A parsed value as the declaration holds it (lists as tuples)."""
    return tuple(cast(list[Any], value)) if isinstance(value, list) else value
