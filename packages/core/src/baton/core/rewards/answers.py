"""A completion's final answer, found the way math rewards commonly find it, and numbers read
from it: what the built-in ``accuracy`` reward compares. Pure Python.

Example::

    from baton.core.rewards.answers import completion_text, final_answer, read_number

    final_answer("<think>2+2</think> <answer> 4 </answer>")    # "4"   (the last <answer> tag)
    final_answer(r"so it is \\boxed{\\frac{1}{2}}.")             # "\\frac{1}{2}" (the last \\boxed{})
    final_answer("It costs $1,250 in total.", "last", numeric=True)   # "1,250" (the last number)
    final_answer("first line\\nThe answer: 7\\n")               # "The answer: 7" (the last line)
    read_number("\\frac{1}{2}"), read_number("$1,250"), read_number("-3.5%")   # 0.5, 1250.0, -3.5
    completion_text([{"role": "assistant", "content": "hi"}])   # "hi" (a conversational completion)

The final answer (``how="auto"``) is the content of the last ``<answer>...</answer>``; else
of the last ``\\boxed{...}`` (braces balanced; ``\\fbox`` too); else the last number in the
text when a number is wanted, or its last non-empty line. ``how`` picks one rule:
``answer_tag``, ``boxed``, ``last`` (number or line), ``whole`` (the whole text, stripped).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

#: the ways :func:`final_answer` finds the answer
How = Literal["auto", "answer_tag", "boxed", "last", "whole"]
HOWS: tuple[str, ...] = ("auto", "answer_tag", "boxed", "last", "whole")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
#: a number as people write one: sign, thousands separators, decimals, an exponent
_NUMBER = re.compile(
    r"[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+\u2212]?\.\d+"
)
_FRACTION = re.compile(r"^\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}$")


def completion_text(completion: Any) -> str:
    """A completion's text: a string as it is; turns (``[{"role": "assistant", "content":
    ...}]``, how conversational completions are given) their contents joined."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        turns = cast(Sequence[Any], completion)
        return "".join(
            str(cast(Mapping[str, Any], turn).get("content") or "")
            if isinstance(turn, Mapping)
            else str(turn)
            for turn in turns
        )
    return str(completion)


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close."""
    found = None
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for position in range(start, len(text)):
            if text[position] == "{":
                depth += 1
            elif text[position] == "}":
                depth -= 1
                if depth == 0:
                    found = text[start:position]
                    break
    return found


def _last_tag(text: str) -> str | None:
    matches: list[str] = _ANSWER_TAG.findall(text)
    return matches[-1] if matches else None


def _last_number(text: str) -> str | None:
    matches: list[str] = _NUMBER.findall(text)
    return matches[-1] if matches else None


def _last_line(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _whole(text: str) -> str | None:
    return text if text.strip() else None


def final_answer(text: str, how: str = "auto", *, numeric: bool = False) -> str | None:
    """The final answer in ``text`` (stripped), or None where the rule finds none; with
    ``numeric``, ``last`` is the last number instead of the last line."""
    last = _last_number if numeric else _last_line
    rules: dict[str, tuple[Callable[[str], str | None], ...]] = {
        "answer_tag": (_last_tag,),
        "boxed": (_last_boxed,),
        "last": (last,),
        "whole": (_whole,),
        "auto": (_last_tag, _last_boxed, last),
    }
    if how not in rules:
        raise ValueError(f"how {how!r} is not one of {', '.join(HOWS)}")
    for rule in rules[how]:
        found = rule(text)
        if found is not None:
            return found.strip()
    return None


def _plain_number(text: str) -> float | None:
    cleaned = text.strip().replace("\u2212", "-").replace(",", "")
    cleaned = re.sub(r"\\[,!; ]|\\\$|\$|\\%|%|\\text\{[^{}]*\}|\s", "", cleaned).rstrip(".")
    fraction = _FRACTION.match(cleaned)
    if fraction is not None:
        numerator, denominator = _plain_number(fraction[1]), _plain_number(fraction[2])
        if numerator is None or not denominator:
            return None
        return numerator / denominator
    if cleaned.count("/") == 1:
        numerator, denominator = (_plain_number(part) for part in cleaned.split("/"))
        if numerator is None or not denominator:
            return None
        return numerator / denominator
    try:
        return float(cleaned)
    except ValueError:
        return None


def read_number(text: str) -> float | None:
    """The number ``text`` is (``$1,250``, ``-3.5%``, ``3/4``, ``\\frac{3}{4}``), else the
    last number in it, else None."""
    whole = _plain_number(text)
    if whole is not None:
        return whole
    last = _last_number(text)
    return None if last is None else _plain_number(last)


def same_text(answer: str, reference: str, ignore_case: bool = False) -> bool:
    """Equal once whitespace runs are one space and the ends are stripped."""
    first, second = " ".join(answer.split()), " ".join(reference.split())
    if ignore_case:
        return first.casefold() == second.casefold()
    return first == second
