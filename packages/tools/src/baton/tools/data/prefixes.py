"""Prefixes of a conversation rendered by a chat template, the conversation prepared once.

``apply_chat_template`` prepares each conversation it renders (its messages without their
``None`` fields, copied as plain JSON data, reasoning fields aliased) and renders it with
the template ``transformers`` compiles, given the tokenizer's special tokens. Rendering one
prefix after another of the same conversation, that preparation is the same each time:
here it is done once per conversation and each prefix is the prepared list cut short (the
sandbox the template runs in cannot change it). The parts are ``transformers``' own; where
a version lacks them, :meth:`PrefixRenderer.load` gives None and the caller renders
through ``apply_chat_template``.

Example::

    renderer = PrefixRenderer.load(tokenizer)
    before, through = renderer.render(turns, [(2, True), (3, False)])
    # turns[:2] with the generation prompt, then turns[:3] without it
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PrefixRenderer:
    """Renders prefixes of conversations as ``apply_chat_template(tokenize=False)`` does."""

    #: the Jinja template ``transformers`` compiles (and caches) for ``apply_chat_template``
    template: Any
    #: what ``apply_chat_template`` gives the template besides the messages and the prompt
    variables: dict[str, Any]
    #: a conversation's messages as ``apply_chat_template`` hands them to the template
    prepare: Callable[[list[dict]], list[dict]]

    @classmethod
    def load(cls, tokenizer: Any) -> PrefixRenderer | None:
        """The renderer of ``tokenizer.chat_template`` (a string), or None where this
        version of ``transformers`` lacks the parts."""
        try:
            from transformers.utils import chat_template_utils as parts

            compiled = parts._compile_jinja_template(tokenizer.chat_template)  # pyright: ignore[reportPrivateUsage]
            plain = parts._plain_template_data  # pyright: ignore[reportPrivateUsage]
            alias = parts._alias_reasoning_fields  # pyright: ignore[reportPrivateUsage]
            special = plain(dict(tokenizer.special_tokens_map))
        except (ImportError, AttributeError, TypeError):
            return None

        def prepare(turns: list[dict]) -> list[dict]:
            kept = [
                {key: value for key, value in turn.items() if value is not None} for turn in turns
            ]
            return alias(plain(kept))

        return cls(compiled, {**special, "tools": None, "documents": None}, prepare)

    def render(self, turns: list[dict], cuts: list[tuple[int, bool]]) -> list[str]:
        """The text of ``turns[:count]`` for each ``(count, generation_prompt)`` of ``cuts``."""
        messages = self.prepare(turns)
        if not all(isinstance(message, dict) for message in messages):
            raise TypeError("chat messages are dicts")
        return [
            self.template.render(
                messages=messages[:count], add_generation_prompt=prompt, **self.variables
            )
            for count, prompt in cuts
        ]
