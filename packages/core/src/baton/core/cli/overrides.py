"""Field-by-field overrides of a backend's native config: ``--set training.seq_len=4096``.

Example::

    apply_overrides(backend.config, ["training.seq_len=4096", "optimizer.lr=3e-4"])

Each ``KEY.PATH=VALUE`` walks attributes of dataclasses and objects, keys of mappings
and indices of lists (``optimizer.param_groups.0.optimizer_kwargs.weight_decay=0.0``);
the value is read as YAML (``4096``, ``3e-4``, ``true``, ``null``, ``[1, 2]``,
plain strings) and must fit the type of the value it replaces (an ``int`` field takes
``4096``, not ``"fast"``; a float field takes an int). An unknown name is an error that
lists the names at that level. A config object with its own ``apply_override(key,
value)`` (e.g. a ``key=value`` override list like MaxText's) takes the whole key
itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, MutableMapping, MutableSequence
from typing import Any, cast

import yaml


class OverrideError(ValueError):
    """A ``--set`` that names no field or whose value does not fit; says which."""


def parse_value(text: str) -> Any:
    """YAML scalars and lists; anything unparsable stays the string it was."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _names(obj: Any) -> list[str]:
    if isinstance(obj, MutableMapping):
        keys: Iterable[Any] = cast(MutableMapping[Any, Any], obj)
        return sorted(map(str, keys))
    if isinstance(obj, MutableSequence):
        return [str(i) for i in range(len(cast(MutableSequence[Any], obj)))]
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    if not hasattr(obj, "__dict__"):
        return []
    attributes = cast(dict[str, Any], vars(obj))
    return sorted(k for k in attributes if not k.startswith("_"))


def _has(obj: Any, name: str) -> bool:
    if isinstance(obj, MutableMapping):
        return name in obj
    return name in _names(obj)


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, MutableMapping):
        return cast(MutableMapping[str, Any], obj)[name]
    if isinstance(obj, MutableSequence):
        return cast(MutableSequence[Any], obj)[int(name)]
    return getattr(obj, name)


def _set(obj: Any, name: str, value: Any) -> None:
    if isinstance(obj, MutableMapping):
        obj[name] = value
    elif isinstance(obj, MutableSequence):
        cast(MutableSequence[Any], obj)[int(name)] = value
    else:
        setattr(obj, name, value)


def _coerce(key: str, old: Any, new: Any) -> Any:
    if old is None or new is None:
        return new
    if isinstance(old, bool):
        if not isinstance(new, bool):
            raise OverrideError(f"--set {key}: expected true or false, got {new!r}")
        return new
    if isinstance(old, float) and isinstance(new, int) and not isinstance(new, bool):
        return float(new)
    if isinstance(old, int | float | str) and not isinstance(new, type(old)):
        raise OverrideError(
            f"--set {key}: expected a {type(old).__name__} like the current {old!r}, got {new!r}"
        )
    if isinstance(old, tuple) and isinstance(new, list):
        return tuple(cast(list[Any], new))
    return new


def apply_override(config: Any, assignment: str) -> tuple[str, Any]:
    """Apply one ``KEY.PATH=VALUE``; returns ``(key, value)`` as applied."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise OverrideError(
            f"--set {assignment!r}: write KEY.PATH=VALUE, e.g. training.seq_len=4096"
        )
    value = parse_value(text)
    hook = getattr(config, "apply_override", None)
    if callable(hook):
        hook(key, value)
        return key, value
    target, parts = config, key.split(".")
    for depth, name in enumerate(parts):
        if not _has(target, name):
            where = ".".join(parts[:depth]) or "the config"
            known = ", ".join(_names(target)) or "(nothing to set)"
            raise OverrideError(f"--set {key}: {where} has no field {name!r}; fields: {known}")
        if depth == len(parts) - 1:
            value = _coerce(key, _get(target, name), value)
            _set(target, name, value)
        else:
            target = _get(target, name)
    return key, value


def apply_overrides(config: Any, assignments: Iterable[str]) -> dict[str, Any]:
    """Apply each assignment in order; returns what was set, for the run record."""
    return dict(apply_override(config, a) for a in assignments)


def set_fields(config: Any, fields: Mapping[str, Any], *, hint: str = "") -> None:
    """Set each of ``fields`` on ``config``, a backend's config object, as its keyword
    arguments do (``MegatronBackend(seq_len=64)``); a name the config lacks raises
    ``TypeError`` naming the config's class and the field, then ``hint``.

    >>> from types import SimpleNamespace
    >>> config = SimpleNamespace(seq_len=8)
    >>> set_fields(config, {"seq_len": 64})
    >>> config.seq_len
    64
    """
    for key, value in fields.items():
        if not hasattr(config, key):
            raise TypeError(f"{type(config).__name__} has no field {key!r}{hint}")
        setattr(config, key, value)
