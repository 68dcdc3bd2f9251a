"""``json_value``: the settings' view (anything unknown as its ``str``) and the native
config's fuller view (dataclasses, mappings and sets walked, anything else its ``repr``)."""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from pathlib import Path

from baton.core.json_values import MAX_DEPTH, json_value


@dataclasses.dataclass
class Inner:
    seq_len: int = 4096
    path: Path = Path("data/x")


@dataclasses.dataclass
class Config:
    inner: Inner = dataclasses.field(default_factory=Inner)
    tags: frozenset[str] = frozenset({"a"})


def test_settings_view_keeps_json_values_and_writes_the_rest_as_str():
    value = {"steps": 10, 2: (1.5, None, True), "path": Path("runs/a"), "cfg": Inner()}
    assert json_value(value) == {
        "steps": 10,
        "2": [1.5, None, True],
        "path": "runs/a",
        "cfg": str(Inner()),
    }
    assert json_value({1, 2}) == str({1, 2})  # a set is not walked: the recorded form stays
    json.dumps(json_value(value))


def test_native_view_walks_dataclasses_mappings_and_sets_and_reprs_the_rest():
    walked = json_value({"config": Config(), "order": OrderedDict(b=1)}, native=True)
    assert walked == {
        "config": {"inner": {"seq_len": 4096, "path": repr(Path("data/x"))}, "tags": ["a"]},
        "order": {"b": 1},
    }
    json.dumps(walked)


def test_native_view_stops_at_the_depth_limit():
    deep: list = []
    inner = deep
    for _ in range(MAX_DEPTH + 3):
        inner.append([])
        inner = inner[0]
    walked = json_value(deep, native=True)
    for _ in range(MAX_DEPTH):
        walked = walked[0]
    assert isinstance(walked, list) and isinstance(walked[0], str)
