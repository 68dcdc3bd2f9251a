"""TorchTitan's tokenizer with the chat templates post-training data is rendered with::

BATON_PATCHES=all,-torchtitan_chat_template_generation baton run ...   # to leave it off
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.torchtitan.patches.common import VERSIONS
from baton.core.patches import Patch, PatchRecorder

if TYPE_CHECKING:
    from baton.core.driver_view import DriverView


class TorchTitanChatTemplateGeneration(Patch):
    """Let TorchTitan's tokenizer load chat templates with ``{% generation %}`` tags.

    TorchTitan 0.3 compiles a tokenizer directory's chat template when it builds the
    tokenizer, in a Jinja environment without transformers' ``generation`` tag (which
    marks the assistant's tokens for ``return_assistant_tokens_mask``), and fails with
    ``TemplateSyntaxError: unknown tag 'generation'``. This wraps
    ``BaseTokenizer.set_chat_template`` so the tag renders its body unchanged, as
    transformers renders it (``chat_template.py``); undo restores the method.
    """

    name = "torchtitan_chat_template_generation"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "configure"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        from torchtitan.components.tokenizer import BaseTokenizer

        from baton.backends.torchtitan.chat_template import allow_generation_tags

        original = BaseTokenizer.set_chat_template
        recorder.setattr(BaseTokenizer, "set_chat_template", allow_generation_tags(original))
