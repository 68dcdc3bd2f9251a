"""The post-training input formats (TRL's), recognised from each record's fields.

* ``messages``: ``{"messages": [{"role": "user", "content": "..."}, ...]}``
* ``prompt_completion``: ``{"prompt": ..., "completion": ...}``
* ``preference``: ``{"prompt": ..., "chosen": ..., "rejected": ...}``
* ``prompt``: ``{"prompt": ..., "answer": ..., ...}``: a prompt alone, for online RL (GRPO
  generates the completions); its other fields are columns that travel with it to the
  reward functions. A record is a prompt only when it has no ``completion``, ``chosen``,
  ``rejected`` or ``messages``.

``prompt``, ``completion``, ``chosen`` and ``rejected`` are strings, or lists of turns
(conversational: the prompt's turns, then the completion's). Records of two formats in
one input are refused.

Example::

    from baton.tools.data.formats import record_format, check_record

    fmt = record_format({"prompt": "2+2=", "completion": "4"}, "data.jsonl line 1")
    check_record(record, fmt, "data.jsonl line 1")    # DataError naming the fix
"""

from __future__ import annotations

from typing import Any

from baton.data import DataError

FORMATS = ("messages", "prompt_completion", "preference", "prompt")
#: the fields that name each format, most specific first
FIELDS = {
    "preference": ("prompt", "chosen", "rejected"),
    "prompt_completion": ("prompt", "completion"),
    "messages": ("messages",),
    "prompt": ("prompt",),
}
#: fields that make a record with a prompt more than a prompt
ANSWERS = ("completion", "chosen", "rejected", "messages")
ROLES = ("system", "developer", "user", "assistant", "tool")


def record_format(record: dict[str, Any], where: str) -> str:
    """The format whose fields ``record`` has; :class:`DataError` when it has none or two."""
    # a null field is absent (Parquet and saved datasets hold every column in every row)
    present = {key for key, value in record.items() if value is not None}
    found = [name for name, fields in FIELDS.items() if present.issuperset(fields)]
    if "prompt" in found and present.intersection(ANSWERS):  # a pair or a half of one
        found.remove("prompt")
    if len(found) == 1:
        return found[0]
    keys = ", ".join(sorted(map(str, present))) or "none"
    if not found:
        raise DataError(
            f"{where} has none of the post-training formats' fields (its keys: {keys}); give "
            "messages, prompt/completion, prompt/chosen/rejected or a prompt alone, or pass "
            "--format"
        )
    raise DataError(
        f"{where} has the fields of two formats ({', '.join(found)}; keys: {keys}); keep one "
        "format per file, or pass --format to choose"
    )


def is_conversational(value: Any) -> bool:
    return isinstance(value, list)


def _check_turns(turns: Any, where: str, field: str) -> list[dict[str, Any]]:
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: {field!r} is not a non-empty list of turns; fix the record")
    for number, turn in enumerate(turns):
        if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
            raise DataError(
                f"{where}: turn {number} of {field!r} is not {{'role': ..., 'content': ...}}; "
                "fix the record"
            )
        if turn["role"] not in ROLES:
            raise DataError(
                f"{where}: turn {number} of {field!r} has role {turn['role']!r}, not one of "
                f"{', '.join(ROLES)}; fix the record"
            )
    return turns


def check_conversation(messages: Any, where: str, field: str = "messages") -> list[dict]:
    """Turns in order: system/developer turns first, then a user turn, then assistant and user
    turns (tool turns after an assistant turn), with at least one assistant turn."""
    turns = _check_order(messages, where, field)
    if not any(turn["role"] == "assistant" for turn in turns):
        raise DataError(
            f"{where}: the conversation has no assistant turn, so nothing to learn; drop the "
            "record or add the assistant's answer"
        )
    return turns


def _check_order(messages: Any, where: str, field: str) -> list[dict]:
    """The turns, each a known role, in the order :func:`check_conversation` names."""
    turns = _check_turns(messages, where, field)
    previous = None
    for number, turn in enumerate(turns):
        role = turn["role"]
        allowed = {
            None: ("system", "developer", "user"),
            "system": ("developer", "user"),
            "developer": ("system", "user"),
            "user": ("assistant",),
            "assistant": ("user", "tool"),
            "tool": ("tool", "assistant"),
        }[previous]
        if role not in allowed:
            after = f"after a {previous} turn" if previous else "first"
            raise DataError(
                f"{where}: turn {number} of {field!r} is a {role} turn {after} (roles out of "
                f"order; expected {' or '.join(allowed)}); fix or drop the record"
            )
        previous = role
    return turns


def check_prompt(prompt: Any, where: str) -> None:
    """A prompt alone: non-empty text, or turns in the order of a conversation (the
    completion is generated after the last one)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: the prompt is empty; drop the record or fill it in")
        return
    if not is_conversational(prompt):
        raise DataError(
            f"{where}: 'prompt' is a {type(prompt).__name__}, not text or a list of turns; "
            "fix the record"
        )
    _check_order(prompt, where, "prompt")


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "".join(str(turn.get("content") or "") for turn in value)


def check_record(record: dict[str, Any], fmt: str, where: str) -> None:
    """Raise :class:`DataError` naming the fix for a record that ``fmt`` cannot use."""
    missing = [key for key in FIELDS[fmt] if record.get(key) is None]
    if missing:
        raise DataError(
            f"{where} has no {', '.join(map(repr, missing))} for format {fmt}; fix the record "
            "or pass another --format"
        )
    if fmt == "messages":
        check_conversation(record["messages"], where)
        return
    if fmt == "prompt":
        check_prompt(record["prompt"], where)
        return
    values = {key: record[key] for key in FIELDS[fmt]}
    kinds = {
        key: "turns" if is_conversational(v) else type(v).__name__ for key, v in values.items()
    }
    if len(set(kinds.values())) != 1 or next(iter(kinds.values())) not in ("str", "turns"):
        shown = ", ".join(f"{key} is {kind}" for key, kind in kinds.items())
        raise DataError(f"{where}: {shown}; give all of them as strings or all as lists of turns")
    answers = ("completion",) if fmt == "prompt_completion" else ("chosen", "rejected")
    if is_conversational(values["prompt"]):
        _check_turns(values["prompt"], where, "prompt")
        for key in answers:
            _check_turns(values[key], where, key)
            check_conversation(values["prompt"] + values[key], where, f"prompt + {key}")
    for key in answers:
        if not _text_of(values[key]).strip():
            raise DataError(f"{where}: the {key} is empty; drop the record or fill it in")
    if fmt == "preference" and values["chosen"] == values["rejected"]:
        raise DataError(
            f"{where}: chosen equals rejected, so the pair prefers nothing; drop the record"
        )
