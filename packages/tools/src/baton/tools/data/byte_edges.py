"""Where the tokens of a byte-level BPE start and end, from their ids alone.

In a byte-level BPE (GPT-2's, Llama 3's, Qwen's tokenizers) every token is a run of the
text's UTF-8 bytes: a vocabulary token's string holds one character per byte, an added
token is its content. Where a text's tokens add up to its length in bytes, they tile it in
order, and the character offsets ``tokenizers`` gives each token are those of its first
and last byte (a character split across tokens belongs to each of them). So the ids of
``encode_batch_fast``, which skips the offsets, tell where a turn's edge falls as well as
``encode_batch``'s offsets do. :meth:`ByteEdges.load` gives None for any other kind of
tokenizer (a normalizer, a prefix space, trimmed offsets, added tokens that take in
spaces), and :meth:`ByteEdges.of` gives None for a text its tokens do not tile.

Example::

    edges = ByteEdges.load(tokenizer.backend_tokenizer)
    encoding = tokenizer.backend_tokenizer.encode_batch_fast([text])[0]
    [found] = edges.of([text], [encoding.ids])
    token, crosses = found.edge(12)   # first token from character 12; one spans it?
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np


def _steps(part: dict | None) -> list[dict]:
    """A tokenizer component and the steps of a ``Sequence`` of them, flattened."""
    if part is None:
        return []
    for key in ("pretokenizers", "processors"):
        if part.get("type") == "Sequence" and key in part:
            return [step for inner in part[key] for step in _steps(inner)]
    return [part]


def _tiles_bytes(config: dict[str, Any]) -> bool:
    """The tokenizer's tokens are runs of the text's bytes, offsets untrimmed."""
    pre = _steps(config.get("pre_tokenizer"))
    post = _steps(config.get("post_processor"))
    return (
        config.get("normalizer") is None
        and config.get("model", {}).get("type") == "BPE"
        and any(step.get("type") == "ByteLevel" for step in pre)
        and all(
            step.get("type") == "Split"
            or (step.get("type") == "ByteLevel" and not step.get("add_prefix_space"))
            for step in pre
        )
        and all(
            step.get("type") == "TemplateProcessing"
            or (step.get("type") == "ByteLevel" and not step.get("trim_offsets"))
            for step in post
        )
    )


@dataclass(frozen=True)
class ByteEdges:
    """The length in bytes of every token id of a byte-level BPE."""

    lengths: np.ndarray

    @classmethod
    def load(cls, backend: Any) -> ByteEdges | None:
        """The lengths of ``backend``'s ids (a ``tokenizers.Tokenizer``), or None where
        its tokens are not runs of the text's bytes."""
        from tokenizers import pre_tokenizers

        if not _tiles_bytes(json.loads(backend.to_str())):
            return None
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        lengths = np.zeros(backend.get_vocab_size(with_added_tokens=True), dtype=np.int64)
        for token, number in backend.get_vocab(with_added_tokens=False).items():
            if not alphabet.issuperset(token):
                return None
            lengths[number] = len(token)
        for number, added in backend.get_added_tokens_decoder().items():
            if added.lstrip or added.rstrip or not added.content:
                return None
            lengths[number] = len(added.content.encode("utf-8"))
        return cls(lengths)

    def of(self, texts: list[str], ids: list[list[int]]) -> list[TokenBytes | None]:
        """Where the tokens ``ids[k]`` of each ``texts[k]`` start and end (all of them in
        one array), or None for a text they do not tile."""
        counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(counts.sum()))
        sizes = self.lengths[flat]
        ends = np.cumsum(sizes)
        firsts = np.cumsum(counts) - counts  # where each text's tokens begin
        before = np.concatenate([[0], ends])[firsts]  # bytes before each text's first token
        totals = np.concatenate([[0], ends])[firsts + counts] - before
        starts = ends - sizes
        empty = sizes == 0
        found: list[TokenBytes | None] = []
        for text, first, count, offset, total in zip(
            texts, firsts.tolist(), counts.tolist(), before.tolist(), totals.tolist(), strict=True
        ):
            last = first + count
            if total != len(text.encode("utf-8")) or empty[first:last].any():
                found.append(None)
            else:
                found.append(
                    TokenBytes(text, starts[first:last] - offset, ends[first:last] - offset)
                )
        return found


@dataclass(frozen=True)
class TokenBytes:
    """Where each token of ``text`` starts and ends, in bytes."""

    text: str
    starts: np.ndarray
    ends: np.ndarray

    def edge(self, position: int) -> tuple[int, bool]:
        """``(token, crosses)``: the first token that starts at or after character
        ``position``, and whether the token before it ends after ``position``."""
        if position >= len(self.text):  # every token starts before the text's end
            return len(self.ends), False
        at = len(self.text[:position].encode("utf-8"))
        token = int(np.searchsorted(self.starts, at, side="left"))
        return token, bool(token > 0 and self.ends[token - 1] > at)
