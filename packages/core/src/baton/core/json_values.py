"""Any value as JSON-friendly data, for what a run records (its settings, the callbacks'
arguments, the native config in the run record).

Two views, one walk::

    json_value({"steps": 10, "path": Path("a")})        # {'steps': 10, 'path': 'a'}
    json_value(backend.config, native=True)             # dataclasses as dicts, ...

The default view keeps JSON values (``None``, booleans, numbers, strings, lists, tuples,
dicts with their keys as strings) and writes anything else as its ``str``. Settings are
compared on resume, so this form must not change. ``native=True`` is the fuller view of
a framework's config: dataclasses become dicts of their fields, any mutable mapping a
dict, sets lists, anything else its ``repr``, and nesting past ``MAX_DEPTH`` its ``repr``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, MutableMapping
from typing import Any, cast

#: how deep ``native=True`` walks before writing a value's ``repr``
MAX_DEPTH = 12


def json_value(value: Any, *, native: bool = False) -> Any:
    """``value`` as JSON-friendly data (see the module's docstring for the two views).

    >>> json_value({1: (True, None), "x": object}, native=False)
    {'1': [True, None], 'x': "<class 'object'>"}
    >>> json_value({"a": {1, 2}}, native=True)
    {'a': [1, 2]}
    """
    return _walk(value, native, 0)


def _walk(value: Any, native: bool, depth: int) -> Any:
    if native and depth > MAX_DEPTH:
        return repr(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if native and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _walk(getattr(value, f.name), native, depth + 1)
            for f in dataclasses.fields(value)
        }
    if isinstance(value, dict) or (native and isinstance(value, MutableMapping)):
        mapping = cast(MutableMapping[Any, Any], value)
        return {str(k): _walk(v, native, depth + 1) for k, v in mapping.items()}
    if isinstance(value, list | tuple) or (native and isinstance(value, set | frozenset)):
        items = cast(Iterable[Any], value)
        return [_walk(v, native, depth + 1) for v in items]
    return repr(value) if native else str(value)
