"""``baton data inspect PREFIX``: what a prepared dataset holds, in the words of what it is
for, and its first items decoded.

Each kind of prepared data is described by one small function of ``KINDS`` (its
manifest's ``objective`` -> the function): pretraining text in documents and tokens,
conversations (``--objective sft``) in packed rows, conversations and supervised
tokens, preference pairs (``--objective dpo``) in rows, pairs and supervised tokens,
prompts (``--objective grpo``, ``describe_prompts.py``) with their columns. A
post-training item is shown with its supervised tokens (the ones the loss is on) in
``[[...]]``, and also coloured where ``color`` is set (``baton data inspect`` sets it
when stdout is a terminal), as TRL's and axolotl's previews mark them.

Example::

    baton data inspect data/corpus                     # tokenizer from the manifest
    baton data inspect data/corpus --tokenizer runs/tok -n 5
    baton data inspect data/chat -n 2                  # 2 conversations, supervised marked
    baton data inspect data/pairs -n 1                 # 1 pair: chosen and rejected
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from baton.core.objectives import DataKind
from baton.data import DataError, PreparedDataset, TokenizerInfo, load_tokenizer
from baton.data.packed import PackedDataset, data_objective
from baton.tools.data.describe_prompts import rollout_prompts

#: around the supervised tokens of a shown item
OPEN, CLOSE = "[[", "]]"
#: ANSI colour of the supervised tokens on a terminal (green), and back to plain
GREEN, PLAIN = "\x1b[32m", "\x1b[0m"


def describe(
    prefix: str | Path,
    tokenizer: str | Path | None = None,
    count: int = 3,
    chars: int = 400,
    *,
    color: bool = False,
) -> str:
    """The report ``baton data inspect`` prints: the describer of the data's kind."""
    kind = data_objective(prefix)
    describer = KINDS.get(kind)
    if describer is None:
        raise DataError(
            f"{prefix} holds {kind!r} data, which this baton cannot describe; update baton"
        )
    return "\n".join(describer(prefix, tokenizer, count, chars, color))


def _tokenizer(data: PreparedDataset, tokenizer: str | Path | None) -> TokenizerInfo | None:
    """The tokenizer to decode with: ``tokenizer``, else the manifest's where its
    directory is there; checked against the data's fingerprint."""
    manifest = data.manifest()
    info: TokenizerInfo | None = None
    if tokenizer is not None:
        info = load_tokenizer(tokenizer)
    elif manifest is not None and Path(manifest.tokenizer_path).is_dir():
        info = load_tokenizer(manifest.tokenizer_path)
    if info is not None:
        data.check_tokenizer(info)
    return info


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + " [...]"


def pretraining_text(
    prefix: str | Path, tokenizer: str | Path | None, count: int, chars: int, color: bool
) -> list[str]:
    """Pretraining text: documents, tokens, the manifest's sources, the first documents."""
    data = PreparedDataset(prefix)
    manifest = data.manifest()
    lines = [
        f"dataset    {data.prefix} ({data.bin_path.stat().st_size:,} bytes .bin)",
        f"documents  {data.num_documents:,}",
        f"sequences  {data.num_sequences:,}",
        f"tokens     {data.num_tokens:,}",
        f"dtype      {data.dtype.name}",
    ]
    if manifest is None:
        lines.append("manifest   none (not prepared by baton: the tokenizer cannot be checked)")
    else:
        lines += [
            f"manifest   {Path(data.prefix + '.json')}",
            f"tokenizer  {manifest.tokenizer_path} (fingerprint "
            f"{manifest.tokenizer_fingerprint[:16]}, {manifest.vocab_size:,} tokens, "
            f"end of document {manifest.eod_token!r} = {manifest.eod_id})",
            f"skipped    {manifest.skipped_empty:,} empty documents",
        ]
        for source in manifest.sources:
            lines.append(
                f"source     {source.path}: {source.bytes:,} bytes, {source.documents:,} "
                f"documents, {source.tokens:,} tokens"
            )
    info = _tokenizer(data, tokenizer)
    shown = min(count, data.num_documents)
    for index in range(shown):
        tokens = data.document(index)
        lines.append(f"--- document {index}: {len(tokens):,} tokens")
        if info is None:
            lines.append(" ".join(str(t) for t in tokens[:64].tolist()))
        else:
            text = info.tokenizer.decode(tokens.tolist(), skip_special_tokens=False)
            lines.append(_clip(text, chars))
    if shown and info is None:
        lines.append("(token ids: pass --tokenizer DIR to decode)")
    return lines


def marked(
    tokens: Sequence[int] | np.ndarray,
    mask: Sequence[int] | np.ndarray,
    info: TokenizerInfo | None,
    color: bool,
) -> str:
    """``tokens`` decoded (ids without ``info``), the runs of supervised ones (mask 1) in
    ``[[...]]`` (and green where ``color``)."""
    parts: list[str] = []
    start = 0
    for end in range(1, len(tokens) + 1):
        if end < len(tokens) and bool(mask[end]) == bool(mask[start]):
            continue
        run = [int(t) for t in tokens[start:end]]
        text = (
            " ".join(map(str, run))
            if info is None
            else info.tokenizer.decode(run, skip_special_tokens=False)
        )
        if mask[start]:
            text = f"{OPEN}{GREEN}{text}{PLAIN}{CLOSE}" if color else f"{OPEN}{text}{CLOSE}"
        parts.append(text)
        start = end
    return (" " if info is None else "").join(parts)


def _packed_head(data: PackedDataset, items: str, count: int) -> list[str]:
    """What every post-training dataset says first: rows, items, tokens, the format."""
    manifest: dict[str, Any] = data.manifest
    packing = manifest.get("packing", {})
    tokens, supervised = int(manifest["tokens"]), int(manifest["supervised_tokens"])
    share = supervised / tokens if tokens else 0.0
    fill = packing.get("fill")
    fill_text = f", fill {fill:.1%}" if isinstance(fill, float) else ""
    tokenizer = manifest["tokenizer"]
    lines = [
        f"dataset            {data.prefix}",
        f"{items:<19}{count:,}"
        + (f" (from {manifest['records']:,} records)" if "records" in manifest else ""),
        f"rows               {data.num_rows:,} packed rows of {data.seq_len + 1} tokens "
        f"(--seq-len {data.seq_len}){fill_text}",
        f"tokens             {tokens:,}",
        f"supervised tokens  {supervised:,} ({share:.1%}: the tokens the loss is on)",
    ]
    fmt = manifest.get("input_format")
    if fmt is not None:
        lines.append(f"format             {fmt}, supervised: {manifest.get('mask', '?')}")
    template = manifest.get("template")
    if isinstance(template, dict):
        lines.append(
            f"chat template      from the {template.get('source', '?')}, sha256 "
            f"{str(template.get('sha256', ''))[:16]}"
        )
    if manifest.get("truncated"):
        lines.append(f"truncated          {int(manifest['truncated']):,} cut to fit a row")
    lines.append(
        f"tokenizer          {tokenizer['path']} (fingerprint "
        f"{str(tokenizer['fingerprint'])[:16]}, {int(tokenizer['vocab_size']):,} tokens)"
    )
    return lines


def _rows_of_sequences(data: PackedDataset) -> list[int]:
    """The row each sequence (conversation, completion) was packed into."""
    bounds = data.indexed.document_indices
    return [row for row in range(data.num_rows) for _ in range(bounds[row], bounds[row + 1])]


def _decoder(data: PackedDataset, tokenizer: str | Path | None) -> TokenizerInfo | None:
    return _tokenizer(data.indexed, tokenizer)


def conversations(
    prefix: str | Path, tokenizer: str | Path | None, count: int, chars: int, color: bool
) -> list[str]:
    """Conversations for ``--objective sft``: rows, conversations, supervised tokens,
    fill, then the first ``count`` conversations with their supervised tokens marked."""
    data = PackedDataset(prefix)
    lines = _packed_head(data, "conversations", data.num_sequences)
    info = _decoder(data, tokenizer)
    rows = _rows_of_sequences(data)
    for index in range(min(count, data.num_sequences)):
        tokens, mask = data.document(index)
        lines.append(
            f"--- conversation {index} (row {rows[index]}): {len(tokens):,} tokens, "
            f"{int(mask.sum()):,} supervised {OPEN}marked{CLOSE}"
        )
        lines.append(_clip(marked(tokens, mask, info, color), chars))
    return lines + _decode_hint(info, count)


def preference_pairs(
    prefix: str | Path, tokenizer: str | Path | None, count: int, chars: int, color: bool
) -> list[str]:
    """Preference pairs for ``--objective dpo``: rows, pairs, supervised tokens, fill,
    then the first ``count`` pairs, chosen and rejected, supervised tokens marked."""
    data = PackedDataset(prefix)
    pairs = data.num_sequences // 2
    lines = _packed_head(data, "pairs", pairs)
    info = _decoder(data, tokenizer)
    rows = _rows_of_sequences(data)
    for pair in range(min(count, pairs)):
        lines.append(f"--- pair {pair} (row {rows[2 * pair]})")
        for side, index in (("chosen", 2 * pair), ("rejected", 2 * pair + 1)):
            tokens, mask = data.document(index)
            lines.append(
                f"{side} ({len(tokens):,} tokens, {int(mask.sum()):,} supervised): "
                + _clip(marked(tokens, mask, info, color), chars)
            )
    return lines + _decode_hint(info, count)


def _decode_hint(info: TokenizerInfo | None, count: int) -> list[str]:
    return ["(token ids: pass --tokenizer DIR to decode)"] if count and info is None else []


#: a kind of prepared data (its manifest's ``objective``) -> what describes it
#: each kind of prepared data (its manifest's ``objective``), its describer
KINDS: dict[str, Callable[[str | Path, str | Path | None, int, int, bool], list[str]]] = {
    DataKind.TEXT: pretraining_text,
    DataKind.CONVERSATIONS: conversations,
    DataKind.PAIRS: preference_pairs,
    DataKind.PROMPTS: rollout_prompts,
}

__all__ = ["KINDS", "DataError", "describe", "marked"]
