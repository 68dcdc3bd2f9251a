"""Values from a ``--config`` file, checked against the recipe's parameter types.

A YAML or TOML file says ``max_steps: forty`` as easily as ``max_steps: 40``; the
command line's parser checks flags but not a file's values, so they are checked here,
before the recipe runs, naming the parameter, the value and the type it takes::

    conform("max_steps", "forty", int, "exp.yaml")
    # RecipeError: --config exp.yaml: max_steps is 'forty', not a whole number ...

Numbers written as text that YAML 1.1 leaves a string (``lr: 1e-3``) become numbers.
"""

from __future__ import annotations

import types
import typing
from collections import abc
from pathlib import Path
from typing import Any, Literal, cast

from baton.core.errors import RecipeError

_NAMES: dict[Any, str] = {
    int: "a whole number",
    float: "a number",
    str: "text",
    bool: "true or false",
    Path: "a path",
    type(None): "null",
}


class ValueMismatch(ValueError):
    """A value that its parameter's type does not take (``coerce`` raises it)."""


_Mismatch = ValueMismatch


def conform(name: str, value: Any, annotation: Any, source: str | Path) -> Any:
    """``value`` as ``annotation`` takes it, or a ``RecipeError`` that names the file,
    the parameter, the value and what it should be."""
    try:
        return _conform(value, annotation)
    except _Mismatch:
        raise RecipeError(
            f"--config {source}: {name} is {value!r}, not {type_name(annotation)}; "
            f"fix the value in the file (or pass --{name.replace('_', '-')} on the command line)"
        ) from None


def coerce(value: Any, annotation: Any) -> Any:
    """``value`` as ``annotation`` takes it (``"1e-3"`` -> ``0.001`` for a float), or
    ``ValueMismatch``: ``coerce(600, float) == 600.0``."""
    return _conform(value, annotation)


def type_name(annotation: Any) -> str:
    """What a type accepts, in words: ``int | None`` -> "a whole number or null"."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (tuple, list, abc.Sequence):
        return "a list"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def spelled_as_text(annotation: Any) -> bool:
    """Whether a command line or a config file can give a value of this type: numbers,
    text, paths, true/false, null, a ``Literal``'s choices, tables, lists of these and
    unions with one of these (``Console | None`` has none: a ``Console`` is built in code).

    >>> spelled_as_text(float | None), spelled_as_text(list[str]), spelled_as_text(object)
    (True, True, False)
    """
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any or origin is Literal:
        return True
    if origin is typing.Annotated:
        return spelled_as_text(args[0])
    if origin in (typing.Union, types.UnionType):  # some member other than null
        return any(spelled_as_text(a) for a in args if a is not type(None))
    if origin in (tuple, list, abc.Sequence):
        return all(spelled_as_text(a) for a in args if a is not Ellipsis)
    if origin in (dict, abc.Mapping):  # a YAML table
        return True
    return annotation in _NAMES


def _conform(value: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin is typing.Annotated:
        return _conform(value, args[0])
    if origin in (typing.Union, types.UnionType):
        for option in sorted(args, key=lambda a: a is str):  # text last: "1e-3" is a number
            try:
                return _conform(value, option)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        if value in args:
            return value
        raise _Mismatch
    if origin in (tuple, list, abc.Sequence):
        if not isinstance(value, list | tuple):
            raise _Mismatch
        items = cast(list[Any] | tuple[Any, ...], value)
        item = args[0] if args else Any
        conformed = [_conform(v, item) for v in items]
        return tuple(conformed) if origin is tuple else conformed
    return _scalar(value, annotation)


def _scalar(value: Any, annotation: Any) -> Any:
    if annotation is type(None):
        if value is None:
            return None
        raise _Mismatch
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise _Mismatch from None
        raise _Mismatch
    if annotation is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if annotation is Path:
        if isinstance(value, str):
            return value
        raise _Mismatch
    return value  # a type the file cannot spell differently: the recipe checks it
