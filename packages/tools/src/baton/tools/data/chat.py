"""Conversations and preference pairs to token ids and loss masks, with the chat template.

Text is rendered by the tokenizer's own chat template through ``transformers``'
``apply_chat_template``, exactly as TRL's ``SFTTrainer`` and ``DPOTrainer`` tokenize it,
so the same records give the same ids here and there.

Example::

    from baton.tools.data.chat import ChatTokenizer

    chat = ChatTokenizer.load("runs/tok")          # or chat_template="template.jinja"
    ids, mask = chat.messages(record["messages"], mask="assistant")
    documents = chat.conversations([r["messages"] for r in records])   # many at once: faster
    ids, mask = chat.prompt_completion(record["prompt"], record["completion"])
    (chosen, chosen_mask), (rejected, rejected_mask) = chat.pair(prompt, chosen, rejected)

Masks (1: the token is a supervised target):

* ``assistant``: every assistant turn; ``last_assistant``: the last one; ``all``: every token.
  A template with ``{% generation %}`` marks the assistant's tokens itself
  (``return_assistant_tokens_mask``); for any other, the span of assistant turn ``i`` is
  what ``messages[:i + 1]`` adds to ``messages[:i]`` rendered with the generation prompt
  (the wholes of many conversations rendered in one ``apply_chat_template`` call and
  tokenized in one batch, the prefixes rendered as text with each conversation prepared
  once; the edges from the ids of a byte-level BPE, from the offsets otherwise), and a
  template whose prefixes do not render as prefixes of the whole, or a token across a
  turn's edge, is refused.
* prompt/completion and pairs: the completion's tokens (TRL's: where the tokenized prompt
  and prompt + completion diverge); string completions get the end-of-sequence token.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from baton.data import DataError
from baton.tools.data.byte_edges import ByteEdges
from baton.tools.data.prefixes import PrefixRenderer

MASKS = ("assistant", "all", "last_assistant")

Tokens = tuple[list[int], list[int]]


def common_prefix_length(first: list[int], second: list[int]) -> int:
    """How many leading ids ``first`` and ``second`` share."""
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


def _load_auto_tokenizer(directory: Path) -> Any:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except Exception as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataError(
                f"transformers cannot load the tokenizer {directory} ({first}); pass a Hugging "
                "Face tokenizer directory"
            ) from None


@dataclass
class ChatTokenizer:
    """A ``transformers`` tokenizer with a chat template, rendering records to ids and masks."""

    tokenizer: Any
    directory: Path
    #: ``{"source": "tokenizer" | path, "sha256": ...}`` (recorded in the manifest); None
    #: without a template (plain-text prompts and completions need none)
    template: dict[str, str] | None
    #: the template marks the assistant's tokens with ``{% generation %}``
    marks_generation: bool
    #: renders prefixes (loaded on first use; False where transformers lacks the parts)
    _prefix_renderer: PrefixRenderer | Literal[False] | None = field(default=None, repr=False)
    #: token edges from ids (loaded on first use; False where the tokenizer is no byte-level BPE)
    _edges: ByteEdges | Literal[False] | None = field(default=None, repr=False)

    @classmethod
    def load(cls, directory: str | Path, chat_template: str | Path | None = None) -> ChatTokenizer:
        """The tokenizer in ``directory``, with the template of file ``chat_template`` if given.

        Conversations rendered without any template raise :class:`DataError` naming
        ``--chat-template``.
        """
        tokenizer = _load_auto_tokenizer(Path(directory))
        if chat_template is not None:
            path = Path(chat_template)
            if not path.is_file():
                raise DataError(f"--chat-template {path} is not a file; pass a Jinja template file")
            tokenizer.chat_template = path.read_text(encoding="utf-8")
            source = str(path)
        else:
            source = "tokenizer"
        template = tokenizer.chat_template
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default")
        if not isinstance(template, str) or not template.strip():
            return cls(tokenizer, Path(directory), None, False)
        tokenizer.chat_template = template
        digest = hashlib.sha256(template.encode("utf-8")).hexdigest()
        marks = re.search(r"{%-?\s*generation\s*-?%}", template) is not None
        return cls(tokenizer, Path(directory), {"source": source, "sha256": digest}, marks)

    # ---- rendering --------------------------------------------------------------------

    def render(self, turns: list[dict], *, generation_prompt: bool = False) -> list[int]:
        """The ids of ``turns`` rendered by the chat template (``apply_chat_template``)."""
        return list(self._apply(turns, add_generation_prompt=generation_prompt)["input_ids"])

    def _apply(self, turns: list[dict] | list[list[dict]], **options: Any) -> Any:
        if self.template is None:
            raise DataError(
                f"tokenizer {self.directory} has no chat template; pass one with "
                "--chat-template FILE (a Jinja template, e.g. the model family's "
                "chat_template.jinja)"
            )
        try:
            if options.get("tokenize") is False:
                return self.tokenizer.apply_chat_template(turns, **options)
            return self.tokenizer.apply_chat_template(
                turns, tokenize=True, return_dict=True, **options
            )
        except Exception as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataError(
                f"the chat template ({self.template['source']}) fails on a record ({first}); "
                "fix the record or pass another --chat-template"
            ) from None

    def encode(self, text: str) -> list[int]:
        """``text`` tokenized as TRL tokenizes plain text: the tokenizer's own special tokens."""
        return list(self.tokenizer(text=text)["input_ids"])

    def prompts(self, prompts: list[Any]) -> list[list[int]]:
        """The ids of each prompt as TRL's ``GRPOTrainer`` tokenizes it (one call for all):
        text with the tokenizer's own special tokens, lists of turns rendered by the chat
        template with the generation prompt. All text or all turns, as TRL takes them."""
        if prompts and isinstance(prompts[0], list):
            rendered = self._apply(prompts, add_generation_prompt=True)["input_ids"]
        else:
            rendered = self.tokenizer(text=prompts)["input_ids"]
        return [list(ids) for ids in rendered]

    @property
    def eos_token(self) -> str:
        return str(self.tokenizer.eos_token)

    # ---- the three formats ------------------------------------------------------------

    def messages(self, turns: list[dict], mask: str = "assistant") -> Tokens:
        """``(ids, mask)`` of a conversation; ``mask`` is one of :data:`MASKS`."""
        return self.conversations([turns], mask)[0]

    def conversations(
        self, conversations: list[list[dict]], mask: str = "assistant"
    ) -> list[Tokens]:
        """``(ids, mask)`` of each conversation, as :meth:`messages` gives it one by one.

        The texts of all of them are tokenized in one call (``encode_batch``: the tokenizer's
        threads share it); a record that fails fails the whole call, so a caller naming the
        failing record calls :meth:`messages` per record.
        """
        if mask not in MASKS:
            raise DataError(f"--mask {mask!r} is not one of {', '.join(MASKS)}")
        if mask == "all":
            rendered = self._apply(conversations)["input_ids"]
            return [(list(ids), [1] * len(ids)) for ids in rendered]
        if self.marks_generation:
            found = self._marked_spans(conversations)
        else:
            found = self._assistant_spans(conversations)
        return [_masked(ids, spans, mask) for ids, spans in found]

    def _marked_spans(
        self, conversations: list[list[dict]]
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """The ids of each conversation and the spans its ``{% generation %}`` blocks mark
        (one batched ``apply_chat_template``: the texts tokenized in one call)."""
        output = self._apply(conversations, return_assistant_tokens_mask=True)
        return [
            (list(ids), _runs(list(marks)))
            for ids, marks in zip(output["input_ids"], output["assistant_masks"], strict=True)
        ]

    def _assistant_spans(
        self, conversations: list[list[dict]]
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """The ids of each conversation and the token spans of its assistant turns, found
        from the rendered text of prefixes (one tokenization of the whole).

        The wholes are rendered by ``apply_chat_template``, the prefixes by a
        :class:`~baton.tools.data.prefixes.PrefixRenderer` (checked on the first
        conversation against ``apply_chat_template``); where it fails in any way, the
        prefixes are rendered by ``apply_chat_template`` too, which then decides."""
        answers = [
            [number for number, turn in enumerate(turns) if turn["role"] == "assistant"]
            for turns in conversations
        ]
        renderer = self._renderer()
        if renderer is not None:
            try:
                return self._spans(self._rendered_apart(conversations, answers, renderer))
            except Exception:  # any failure: the renders of apply_chat_template decide
                pass
        return self._spans(self._rendered_together(conversations, answers))

    def _renderer(self) -> PrefixRenderer | None:
        if self._prefix_renderer is None and self.template is not None:
            self._prefix_renderer = PrefixRenderer.load(self.tokenizer) or False
        return self._prefix_renderer or None

    def _rendered_apart(
        self, conversations: list[list[dict]], answers: list[list[int]], renderer: PrefixRenderer
    ) -> list[_Rendered]:
        """Each conversation's renders: its prefixes one conversation at a time by
        ``renderer``, the wholes in one ``apply_chat_template`` call."""
        if not any(answers):  # apply_chat_template refuses the empty batch of prefixes
            raise ValueError("no assistant turn")
        wholes = self._apply(conversations, tokenize=False)
        if renderer.render(conversations[0], [(len(conversations[0]), False)]) != [wholes[0]]:
            raise ValueError("the prefix renderer renders otherwise than apply_chat_template")
        renders = []
        for turns, numbers, whole in zip(conversations, answers, wholes, strict=True):
            ends = bool(numbers) and numbers[-1] == len(turns) - 1
            cuts = [(n, True) for n in numbers] + [(n + 1, False) for n in numbers]
            texts = renderer.render(turns, cuts[:-1] if ends else cuts)
            through = texts[len(numbers) :] + ([whole] if ends else [])
            renders.append(_Rendered(numbers, texts[: len(numbers)], through, whole))
        return renders

    def _rendered_together(
        self, conversations: list[list[dict]], answers: list[list[int]]
    ) -> list[_Rendered]:
        """Each conversation's renders, all by ``apply_chat_template``: every prefix up to
        an assistant turn with the generation prompt in one call, then every prefix through
        one, and the whole where it goes on after its last assistant turn (otherwise the
        prefix through that turn is the whole)."""
        ends = [
            bool(numbers) and numbers[-1] == len(turns) - 1
            for turns, numbers in zip(conversations, answers, strict=True)
        ]
        befores = iter(
            self._apply(
                [
                    turns[:n]
                    for turns, numbers in zip(conversations, answers, strict=True)
                    for n in numbers
                ],
                tokenize=False,
                add_generation_prompt=True,
            )
        )
        throughs = iter(
            self._apply(
                [
                    prefix
                    for turns, numbers, whole in zip(conversations, answers, ends, strict=True)
                    for prefix in [turns[: n + 1] for n in numbers] + ([] if whole else [turns])
                ],
                tokenize=False,
            )
        )
        renders = []
        for numbers, whole in zip(answers, ends, strict=True):
            before = [next(befores) for _ in numbers]
            through = [next(throughs) for _ in numbers]
            text = through[-1] if whole else next(throughs)
            renders.append(_Rendered(numbers, before, through, text))
        return renders

    def _spans(self, renders: list[_Rendered]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Each conversation's ids (its whole text tokenized, as ``apply_chat_template``
        tokenizes it) and the token spans of its assistant turns. A byte-level BPE finds
        the edges from the ids (:class:`~baton.tools.data.byte_edges.ByteEdges`, the texts
        tokenized without offsets); other tokenizers, or a text its tokens do not tile,
        from the offsets."""
        backend = self.tokenizer.backend_tokenizer
        texts = [render.text for render in renders]
        edges = self._byte_edges()
        ids: list[list[int]] = []
        finders: list[Callable[[int], tuple[int, bool]] | None] = []
        if edges is not None:
            ids = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
            finders = [None if f is None else f.edge for f in edges.of(texts, ids)]
        else:
            ids, finders = [[] for _ in texts], [None for _ in texts]
        missing = [number for number, finder in enumerate(finders) if finder is None]
        # apply_chat_template(tokenize=True) is this call through transformers' wrapper
        encodings = backend.encode_batch([texts[n] for n in missing], add_special_tokens=False)
        for number, encoding in zip(missing, encodings, strict=True):
            ids[number], finders[number] = encoding.ids, partial(_offset_edge, encoding)
        found = []
        for tokens, render, finder in zip(ids, renders, finders, strict=True):
            assert finder is not None  # every text has one by now
            found.append((tokens, _prefix_spans(render, finder)))
        return found

    def _byte_edges(self) -> ByteEdges | None:
        if self._edges is None:
            self._edges = ByteEdges.load(self.tokenizer.backend_tokenizer) or False
        return self._edges or None

    def prompt_completion(self, prompt: Any, completion: Any) -> Tokens:
        """``(ids, mask)``: the mask covers the completion, as TRL's ``SFTTrainer``."""
        prompt_ids, full = self._prompt_and_full(prompt, completion)
        start = common_prefix_length(prompt_ids, full)
        return full, [0] * start + [1] * (len(full) - start)

    def pair(self, prompt: Any, chosen: Any, rejected: Any) -> tuple[Tokens, Tokens]:
        """The chosen and the rejected document of a pair, as TRL's ``DPOTrainer`` tokenizes
        them: the prompt up to where both diverge from it, then each completion (masked)."""
        prompt_ids, full_chosen = self._prompt_and_full(prompt, chosen)
        _, full_rejected = self._prompt_and_full(prompt, rejected)
        start = min(
            common_prefix_length(prompt_ids, full_chosen),
            common_prefix_length(prompt_ids, full_rejected),
        )
        head = prompt_ids[:start]
        documents = []
        for full in (full_chosen, full_rejected):
            tail = full[start:]
            documents.append((head + tail, [0] * start + [1] * len(tail)))
        return documents[0], documents[1]

    def _prompt_and_full(self, prompt: Any, completion: Any) -> tuple[list[int], list[int]]:
        if isinstance(prompt, list):
            return self.render(prompt, generation_prompt=True), self.render(prompt + completion)
        eos = self.eos_token
        if not completion.endswith(eos):
            completion += eos
        return self.encode(prompt), self.encode(prompt + completion)


@dataclass
class _Rendered:
    """A conversation's texts: before each assistant turn (``answers``) with the generation
    prompt, through each, and the whole."""

    answers: list[int]
    befores: list[str]
    throughs: list[str]
    text: str


def _masked(ids: list[int], spans: list[tuple[int, int]], mask: str) -> Tokens:
    """``(ids, flags)``: the flags of ``spans`` set (only the last one's for ``last_assistant``)."""
    if not spans:
        raise DataError(
            "the chat template marks no assistant token in this conversation; "
            "check the template's {% generation %} blocks, or pass --mask all"
        )
    if mask == "last_assistant":
        spans = spans[-1:]
    flags = [0] * len(ids)
    for start, end in spans:
        flags[start:end] = [1] * (end - start)
    return ids, flags


class _TokenStarts:
    """Where each token of a ``tokenizers`` encoding starts in its text (character offsets),
    read from the encoding only at the positions looked up: ``bisect`` takes it as a list."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding

    def __len__(self) -> int:
        return len(self.encoding)

    def __getitem__(self, token: int) -> int:
        return self.encoding.token_to_chars(token)[0]


def _offset_edge(encoding: Any, position: int) -> tuple[int, bool]:
    """``(token, crosses)``: the first token of ``encoding`` that starts at or after
    character ``position`` (``bisect_left`` over the tokens' starts), and whether the token
    before it ends after ``position``. The token holding ``position`` is asked for first
    (``char_to_token``); it is the answer when it starts there and the one before it
    starts earlier, which is where a turn's edge falls between two tokens. Otherwise, or
    past the last token's start, it bisects."""
    count = len(encoding)
    if count == 0:
        return 0, False
    last_start, last_end = encoding.token_to_chars(count - 1)
    if last_start < position:
        return count, last_end > position
    token = encoding.char_to_token(position)
    if token is not None and encoding.token_to_chars(token)[0] == position:
        if token == 0:
            return 0, False
        start, end = encoding.token_to_chars(token - 1)
        if start < position:
            return token, end > position
    token = bisect.bisect_left(_TokenStarts(encoding), position)
    return token, token > 0 and encoding.token_to_chars(token - 1)[1] > position


def _prefix_spans(
    render: _Rendered, edge: Callable[[int], tuple[int, bool]]
) -> list[tuple[int, int]]:
    """The token spans of the assistant turns of a conversation: what the text through
    each turn adds to the text before it with the generation prompt (``edge(position)``:
    the first token from a character on, and whether the token before it spans it). A
    prefix that is no prefix of the whole, or a token across a turn's edge, is refused."""
    spans = []
    for number, before, through in zip(
        render.answers, render.befores, render.throughs, strict=True
    ):
        first, crosses_before = edge(len(before))  # first token of the turn
        end, crosses_through = edge(len(through))  # first token after it
        if (
            not render.text.startswith(through)
            or not through.startswith(before)
            or crosses_before
            or crosses_through
        ):
            raise DataError(
                "the chat template does not render the conversation up to turn "
                f"{number} as a prefix of the whole, so the assistant's tokens cannot be "
                "found; use a template that marks them with {% generation %} "
                "(--chat-template FILE), or pass --mask all"
            )
        if end > first:
            spans.append((first, end))
    return spans


def _runs(flags: list[int]) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of the runs of nonzero flags."""
    spans, start = [], None
    for position, flag in enumerate([*flags, 0]):
        if flag and start is None:
            start = position
        elif not flag and start is not None:
            spans.append((start, position))
            start = None
    return spans
