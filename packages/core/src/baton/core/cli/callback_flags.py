"""Callbacks added, configured and dropped from the command line or a ``--config`` file.

Every recipe takes them, with no change to the recipe: a registered callback (see
``baton callbacks``) is named, with its constructor's arguments typed and checked from
its signature like recipe flags::

    baton run recipes/quickstart.py --callback goodput --callback watchdog:timeout_s=600
    baton run recipes/quickstart.py --callback loss_guard:action=rollback,max_rollbacks=2
    baton run recipes/quickstart.py --no-callback progress
    baton run recipes/quickstart.py --callback logger:sinks=[jsonl,console]
    baton run recipes/quickstart.py --callback my_callbacks.py:EmbedNorm:scale=2
    baton run recipes/quickstart.py --callback mypkg.callbacks:EmbedNorm

A class of your own is named by its file or module and class
(``baton.core.callback_paths``), typed and checked the same way.

A ``--callback`` whose class the recipe already added replaces the recipe's one (that
is how one is configured); any other is appended. ``--no-callback NAME`` drops the
recipe's. A list value is written in brackets, ``keys=[a,b]``; text that YAML reads as
something else (``on``, ``1e-3``) is taken as text where the argument takes text. In a
``--config`` file::

    callbacks:
      - goodput
      - name: watchdog
        timeout_s: 600
      - my_callbacks.py:EmbedNorm:scale=2
    no_callbacks: [progress]

From code::

    choice = parse_callback_flag("watchdog:timeout_s=600")  # CallbackChoice('watchdog', ...)
    callback = build_callback(choice)                       # Watchdog(timeout_s=600.0)
    callback_signature(CALLBACKS.get("watchdog")).params    # names, types, defaults, help
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, cast

import yaml

from baton.core.callback import Callback
from baton.core.callback_paths import (
    CALLBACK_PATH,
    PathKind,
    class_label,
    is_class_path,
    load_class,
    names_class,
    normal_name,
    split_class_path,
)
from baton.core.cli.config_values import ValueMismatch, coerce, type_name
from baton.core.cli.recipe_signature import Param, Signature, help_by_name, summary_of
from baton.core.errors import UsageError, did_you_mean
from baton.core.json_values import json_value
from baton.core.registry import CALLBACKS, UnknownNameError

log = logging.getLogger("baton")


@dataclasses.dataclass(frozen=True)
class CallbackChoice:
    """A callback's registered name or class path (``FILE.py:Class``, ``module:Class``)
    and the arguments given for it (not yet typed); a reward function's the same way."""

    name: str
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict[str, Any])
    #: where it was given, for error messages: ``--callback ...`` or ``--config x.yaml``
    source: str = "--callback"
    #: the arguments are text from a command line (typed on building) or a file's values
    from_text: bool = True


def split_top_level(text: str, separator: str = ",") -> list[str]:
    """``"a=1,b=[x,y]"`` -> ``["a=1", "b=[x,y]"]``: splits outside brackets only."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_callback_flag(text: str) -> CallbackChoice:
    """``NAME`` or ``NAME:key=value,key=value`` as given to ``--callback``; ``NAME`` may
    be a class path, ``FILE.py:Class`` or ``module:Class``."""
    return parse_choice(text, CALLBACK_PATH)


def parse_choice(text: str, kind: PathKind) -> CallbackChoice:
    """``NAME`` or ``NAME:key=value,key=value`` as given to ``kind``'s flag; ``NAME`` may
    be a path, ``FILE.py:name`` or ``module:name``."""
    flag = kind.flag
    source = f"{flag} {text}"
    if is_class_path(text, kind):
        name, rest = split_class_path(text, source, kind)
    else:
        name, _, rest = text.partition(":")
        name = name.strip()
    if not name:
        raise UsageError(
            f"{flag} {text!r}: give a {kind.component} name, e.g. {flag} {kind.name_example}"
        )
    arguments: dict[str, Any] = {}
    for item in split_top_level(rest):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            shown = text[: len(text) - len(rest)].rstrip(":")
            raise UsageError(
                f"{flag} {text}: {item!r} is not key=value; "
                f"write {flag} {shown}:key=value,key=value"
            )
        arguments[key.strip().replace("-", "_")] = value.strip()
    return CallbackChoice(name, arguments, source=source)


def config_callback(entry: Any, source: str) -> CallbackChoice:
    """One item of a config file's ``callbacks:`` list: ``NAME``, ``"NAME:k=v"`` or a
    table ``{name: NAME, key: value, ...}``."""
    if isinstance(entry, str):
        choice = parse_callback_flag(entry)
        return dataclasses.replace(choice, source=f"--config {source}: callbacks: {entry}")
    table = cast(dict[str, Any], entry) if isinstance(entry, dict) else {}
    if isinstance(table.get("name"), str):
        arguments = {str(k).replace("-", "_"): v for k, v in table.items() if k != "name"}
        where = f"--config {source}: callbacks: {table['name']}"
        name = normal_name(cast(str, table["name"]), where)
        return CallbackChoice(name, arguments, source=where, from_text=False)
    raise UsageError(
        f"--config {source}: callbacks: {entry!r} is not a callback; write a name "
        "('- goodput') or a table with a name ('- name: watchdog' and its arguments)"
    )


def callback_class(name: str, source: str) -> type[Callback]:
    """The callback class a registered name or a class path names, or a one-line error
    (the closest registered name when there is one, else the list)."""
    if names_class(name):
        return load_class(name, source)
    try:
        cls = CALLBACKS.get(name)
    except UnknownNameError:
        close = did_you_mean(name, CALLBACKS.names())
        if close is not None:
            raise UsageError(
                f"{source}: unknown callback {name!r}; did you mean {close!r}? "
                "(`baton callbacks` lists them)"
            ) from None
        known = ", ".join(CALLBACKS.names())
        raise UsageError(
            f"{source}: unknown callback {name!r}; registered callbacks: {known} (or a class "
            "of your own: --callback my_callbacks.py:MyCallback)"
        ) from None
    return cast(type[Callback], cls)


def _annotation(raw: Any, module: ModuleType | None) -> Any:
    """A parameter's annotation, evaluated where its class was defined (``Any`` where it
    names something only imported for type checking)."""
    if not isinstance(raw, str):
        return Any if raw is inspect.Parameter.empty else raw
    try:
        scope: dict[str, Any] = vars(module) if module else {}
        return eval(raw, scope)  # the module's own annotation text
    except Exception:
        return Any


def callback_signature(cls: type) -> Signature:
    """The constructor's parameters (name, type, default, help from the docstrings'
    ``Args:`` sections) and the class's summary."""
    init = cast(Callable[..., Any], cls.__init__)  # pyright: ignore[reportUnknownMemberType]
    class_doc = inspect.getdoc(cls) or ""
    init_doc = init.__doc__ or ""
    helps = help_by_name(class_doc) | help_by_name(inspect.cleandoc(init_doc))
    params = _params(cls, helps, keyword_only=False)
    return Signature(params, summary_of(class_doc), class_doc)


def settings_signature(function: Callable[..., Any]) -> Signature:
    """A function's settings: its keyword-only parameters (name, type, default, help
    from its docstring's ``Args:`` section), and its summary."""
    doc = inspect.getdoc(function) or ""
    params = _params(function, help_by_name(doc), keyword_only=True)
    return Signature(params, summary_of(doc), doc)


def _params(
    target: Callable[..., Any], helps: dict[str, str], keyword_only: bool
) -> tuple[Param, ...]:
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    params: list[Param] = []
    for param in inspect.signature(target).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if keyword_only and param.kind is not param.KEYWORD_ONLY:
            continue
        default = dataclasses.MISSING if param.default is param.empty else param.default
        annotation = _annotation(param.annotation, module)
        params.append(Param(param.name, annotation, default, helps.get(param.name, "")))
    return tuple(params)


def _typed(value: Any, annotation: Any, from_text: bool) -> Any:
    """A value as the parameter takes it: text from a command line is read as YAML (a
    number, a list, null), or kept as text where the parameter takes text."""
    if not from_text or not isinstance(value, str):
        return coerce(value, annotation)
    try:
        read = yaml.safe_load(value)
    except yaml.YAMLError:
        read = value
    try:
        return coerce(read, annotation)
    except ValueMismatch:
        return coerce(value, annotation)


def callback_arguments(choice: CallbackChoice, cls: type) -> dict[str, Any]:
    """The choice's arguments typed from ``cls``'s signature; unknown names, wrong
    types and missing required arguments are one-line errors."""
    return typed_arguments(choice, callback_signature(cls).params)


def typed_arguments(choice: CallbackChoice, signature: Sequence[Param]) -> dict[str, Any]:
    """The choice's arguments typed from the parameters ``signature``; unknown names,
    wrong types and missing required arguments are one-line errors."""
    params = {p.name: p for p in signature}
    typed: dict[str, Any] = {}
    for key, value in choice.arguments.items():
        param = params.get(key)
        if param is None:
            label = class_label(choice.name)
            close = did_you_mean(key, params)
            takes = (
                f"did you mean {close!r}?"
                if close
                else "it takes: " + (", ".join(params) or "no arguments")
            )
            raise UsageError(f"{choice.source}: {label} has no argument {key!r}; {takes}")
        try:
            typed[key] = _typed(value, param.annotation, choice.from_text)
        except ValueMismatch:
            raise UsageError(
                f"{choice.source}: {key} is {value!r}, not {type_name(param.annotation)}"
            ) from None
    missing = [
        p.name for p in params.values() if p.default is dataclasses.MISSING and p.name not in typed
    ]
    if missing:
        raise UsageError(
            f"{choice.source}: {class_label(choice.name)} needs {', '.join(missing)}; "
            f"give {missing[0]}=VALUE among its arguments"
        )
    return typed


def build_callback(choice: CallbackChoice) -> Callback:
    """The registered callback built with the choice's arguments."""
    cls = callback_class(choice.name, choice.source)
    arguments = callback_arguments(choice, cls)
    try:
        return cls(**arguments)
    except (ValueError, TypeError) as error:
        raise UsageError(f"{choice.source}: {error}") from None


def apply_callback_choices(
    callbacks: Sequence[Callback],
    added: Sequence[tuple[CallbackChoice, Callback]],
    dropped: Sequence[str],
) -> tuple[list[Callback], list[str]]:
    """The recipe's callbacks with ``dropped`` names removed and ``added`` ones in
    place of the recipe's of the same class (or appended); also the names dropped that
    the recipe did not add (the caller warns about those)."""
    result = list(callbacks)
    unused: list[str] = []
    for name in dropped:
        cls = callback_class(name, f"--no-callback {name}")
        kept = [cb for cb in result if not isinstance(cb, cls)]
        if len(kept) == len(result):
            unused.append(name)
        result = kept
    for choice, callback in added:
        cls = callback_class(choice.name, choice.source)
        at = next((i for i, cb in enumerate(result) if type(cb) is cls), None)
        if at is None:
            result.append(callback)
        else:
            result[at] = callback
    return result, unused


@dataclasses.dataclass(frozen=True)
class CallbackFlags:
    """The callbacks a run adds (``--callback``, a config's ``callbacks:``) and drops
    (``--no-callback``, ``no_callbacks:``), applied to whatever the recipe returns."""

    added: tuple[CallbackChoice, ...] = ()
    dropped: tuple[str, ...] = ()
    #: the names a resumed checkpoint's run added (dropping one of them needs no warning)
    recorded: tuple[str, ...] = ()
    #: dropped names whose recipe switch (its parameter of that name) was turned off
    #: instead: the recipe adds none, which needs no warning either
    switched_off: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, callbacks: Any, dropped: Any, source: str) -> CallbackFlags:
        """A ``--config`` file's ``callbacks:`` and ``no_callbacks:`` lists."""
        entries = _as_list(callbacks, "callbacks", source)
        names = _as_list(dropped, "no_callbacks", source)
        if not all(isinstance(n, str) for n in names):
            raise UsageError(
                f"--config {source}: no_callbacks: list callback names, e.g. [progress]"
            )
        dropped = (normal_name(n, f"--config {source}: no_callbacks: {n}") for n in names)
        return cls(tuple(config_callback(e, source) for e in entries), tuple(dropped))

    def with_flags(self, callback: Sequence[str], no_callback: Sequence[str]) -> CallbackFlags:
        """These and the command line's (which come after a config file's)."""
        added = (*self.added, *(parse_callback_flag(text) for text in callback))
        dropped = (normal_name(n, f"--no-callback {n}") for n in no_callback)
        return CallbackFlags(added, (*self.dropped, *dropped))

    def with_recorded(
        self, records: Any, source: str
    ) -> tuple[CallbackFlags, tuple[CallbackChoice, ...]]:
        """These and the callbacks a checkpoint's run added (its settings' ``callbacks``,
        each ``{"name": ..., argument: value}``) that this run neither gives nor drops: a
        resume rebuilds those (returned too) with their recorded arguments."""
        given = {choice.name for choice in self.added} | set(self.dropped)
        names: list[str] = []
        again: list[CallbackChoice] = []
        for record in _as_list(records, "callbacks", source):
            table = cast(dict[str, Any], record) if isinstance(record, dict) else {}
            name = table.get("name")
            if not isinstance(name, str):
                continue
            names.append(name)
            if name not in given:
                arguments = {str(k): v for k, v in table.items() if k != "name"}
                where = f"{source}: callbacks: {class_label(name)}"
                again.append(CallbackChoice(name, arguments, source=where, from_text=False))
        flags = CallbackFlags((*again, *self.added), self.dropped, tuple(names), self.switched_off)
        return flags, tuple(again)

    def build(self) -> list[tuple[CallbackChoice, Callback]]:
        """Each added callback built, and each dropped name checked: done before the
        recipe runs, so a typo costs no model build."""
        for name in self.dropped:
            callback_class(name, f"--no-callback {name}")
        return [(choice, build_callback(choice)) for choice in self.added]

    def apply(
        self, callbacks: Sequence[Callback], built: Sequence[tuple[CallbackChoice, Callback]]
    ) -> list[Callback]:
        """The recipe's callbacks with these changes (a warning for a dropped name the
        recipe did not add)."""
        result, unused = apply_callback_choices(callbacks, built, self.dropped)
        for name in (n for n in unused if n not in (*self.recorded, *self.switched_off)):
            log.warning(
                "--no-callback %s: the recipe adds no %s callback; nothing dropped", name, name
            )
        return result

    def settings_of(self, built: Sequence[tuple[CallbackChoice, Callback]]) -> dict[str, Any]:
        """What ``--print-config``, the settings and ``run.json`` show: each added
        callback with every argument (given or default), and the dropped names."""
        shown: dict[str, Any] = {}
        if built:
            shown["callbacks"] = [_full_record(choice, cb) for choice, cb in built]
        if self.dropped:
            shown["no_callbacks"] = list(self.dropped)
        return shown


def _as_list(value: Any, key: str, source: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise UsageError(f"--config {source}: {key}: expected a list ('- name' items)")
    return cast(list[Any], value)


def _full_record(choice: CallbackChoice, callback: Callback) -> dict[str, Any]:
    """The choice with the constructor's defaults filled in (its typed values)."""
    cls = type(callback)
    typed = callback_arguments(choice, cls)
    record: dict[str, Any] = {"name": choice.name}
    for param in callback_signature(cls).params:
        value = typed.get(param.name, param.default)
        if value is not dataclasses.MISSING:
            record[param.name] = json_value(value)
    return record


def describe_parameter(param: Param) -> tuple[str, str, str]:
    """``(type, default, help)`` of a parameter, as ``baton callbacks NAME`` shows it."""
    default = "(required)" if param.default is dataclasses.MISSING else repr(param.default)
    kind = "any" if param.annotation is Any else type_name(param.annotation)
    return kind, default, param.help


__all__ = [
    "CallbackChoice",
    "CallbackFlags",
    "apply_callback_choices",
    "build_callback",
    "callback_arguments",
    "callback_class",
    "callback_signature",
    "config_callback",
    "describe_parameter",
    "parse_callback_flag",
    "parse_choice",
    "settings_signature",
    "split_top_level",
    "typed_arguments",
]
