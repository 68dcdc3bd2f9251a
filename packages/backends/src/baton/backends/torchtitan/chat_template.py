"""Chat templates that mark the assistant's tokens, in TorchTitan's tokenizer.

Templates written for ``transformers``' ``return_assistant_tokens_mask`` wrap each
assistant reply in ``{% generation %}...{% endgeneration %}``. TorchTitan 0.3's
``BaseTokenizer.set_chat_template`` compiles templates in a Jinja environment without
that tag, so loading such a tokenizer fails (``TemplateSyntaxError: unknown tag
'generation'``). ``GenerationTag`` is the tag as ``transformers`` renders it when no mask
is asked for: the body, unchanged. ``allow_generation_tags`` adds it to the environment
TorchTitan builds (the ``torchtitan_chat_template_generation`` patch).

Example::

    from torchtitan.components.tokenizer import BaseTokenizer

    set_chat_template = allow_generation_tags(BaseTokenizer.set_chat_template)
    set_chat_template(tokenizer, "{% generation %}{{ messages[0]['content'] }}{% endgeneration %}")
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser


class GenerationTag(Extension):
    """``{% generation %}BODY{% endgeneration %}`` renders ``BODY``."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)  # the tag's name
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def allow_generation_tags(
    set_chat_template: Callable[[Any, str], None],
) -> Callable[[Any, str], None]:
    """``set_chat_template`` (TorchTitan's) whose Jinja environment knows ``generation``:
    TorchTitan builds its environment (its globals and filters) on an empty template, the
    tag is added to it, and the real template is compiled there."""

    def with_generation_tags(tokenizer: Any, template: str) -> None:
        set_chat_template(tokenizer, "")
        environment = tokenizer._chat_template.environment
        environment.add_extension(GenerationTag)
        tokenizer._chat_template = environment.from_string(template)

    return with_generation_tags


@contextmanager
def generation_tags_allowed() -> Iterator[None]:
    """TorchTitan's tokenizers built inside accept ``{% generation %}`` tags (what the
    patch does for a run, here for a tokenizer read while a recipe is built)."""
    from torchtitan.components.tokenizer import BaseTokenizer

    original = BaseTokenizer.set_chat_template
    BaseTokenizer.set_chat_template = allow_generation_tags(original)
    try:
        yield
    finally:
        BaseTokenizer.set_chat_template = original
