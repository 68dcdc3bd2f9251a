"""The data ``baton compare`` trains every backend on: the Python language reference
with a byte-level BPE trained on it (pretraining without ``--data-path``), or a
post-training objective's ``.jsonl``/``.parquet`` prepared once by ``baton data
prepare`` (or a prefix already prepared for it), and the line that says what it holds.

Example::

    from pathlib import Path
    from baton.tools.compare_data import (
        data_layout, prepare_comparison_data, prepare_posttrain_data, prepare_reference)

    prefix, tokenizer = prepare_reference(Path("runs/compare_backends/data"), vocab_size=2048)
    chat = prepare_posttrain_data("chat.jsonl", "hf_model", Path("runs/compare_sft/data"),
                                  seq_len=512, objective="sft")
    data_layout(chat)   # '8 conversations packed in 3 rows; every backend trains on all 3 rows, ...'
    prepare_comparison_data("pretrain", None, None, Path("runs/compare_backends/data"),
                            seq_len=128, vocab_size=2048)   # prints the data line
"""

from __future__ import annotations

import json
from pathlib import Path

from baton.core.objectives import DataKind, objective_named

#: input files a post-training objective prepares (anything else: a prepared prefix)
CHAT_SUFFIXES = (".jsonl", ".parquet")


def prepare_comparison_data(
    objective: str,
    data_path: str | None,
    tokenizer: str | None,
    data_dir: Path,
    *,
    seq_len: int,
    vocab_size: int,
) -> tuple[str, str]:
    """The prefix and tokenizer every backend trains on, announced on one line: a
    post-training objective's data prepared for it (``prepare_posttrain_data``), the
    pretraining data given, or without them the Python reference (``prepare_reference``),
    prepared in ``data_dir``."""
    if objective != "pretrain":
        assert data_path is not None and tokenizer is not None  # check_posttrain
        data_path = prepare_posttrain_data(data_path, tokenizer, data_dir, seq_len, objective)
        print(f"data: {data_path} ({data_layout(data_path)}), tokenizer {tokenizer}", flush=True)
    elif data_path is None or tokenizer is None:
        data_path, tokenizer = prepare_reference(data_dir, vocab_size)
        print(f"data: {data_path} (Python reference), tokenizer {tokenizer}", flush=True)
    return data_path, tokenizer


def prepare_posttrain_data(
    source: str, tokenizer: str, data_dir: Path, seq_len: int, objective: str = "sft"
) -> str:
    """The prefix of ``source`` for ``objective``: a ``.jsonl``/``.parquet`` prepared once
    by ``baton data prepare`` (conversations into ``data_dir/chat``, pairs into
    ``data_dir/preference``, packed into rows of ``seq_len`` inputs; prompts into
    ``data_dir/prompts``), or ``source`` itself, a prefix prepared for it. ``ValueError``
    (``DataError``) for data of another kind or rows of another width."""
    from baton.data.packed import PackedDataset, check_objective

    kind = objective_named(objective).data
    if Path(source).suffix in CHAT_SUFFIXES:
        prefix = data_dir / ("chat" if kind == DataKind.CONVERSATIONS else kind.value)
        if kind == DataKind.PROMPTS:
            from baton.tools.data.prompts import prepare_prompts

            prepare_prompts([source], tokenizer, prefix, force=True)
        else:
            from baton.tools.data.posttrain import prepare_posttrain

            prepare_posttrain([source], tokenizer, prefix, seq_len=seq_len, force=True)
        return str(prefix)
    check_objective(source, objective)
    if kind == DataKind.PROMPTS:
        return source
    width = PackedDataset(source).seq_len
    if width != seq_len:
        raise ValueError(
            f"--data-path {source} holds rows of {width} tokens, --seq-len is {seq_len}; "
            f"pass --seq-len {width}"
        )
    return source


def prepare_reference(data_dir: Path, vocab_size: int) -> tuple[str, str]:
    """A tokenizer and a prepared dataset of the Python language reference, made once."""
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    tokenizer, prefix = data_dir / "tokenizer", data_dir / "reference"
    if not (tokenizer / "tokenizer.json").is_file():
        train_tokenizer(tokenizer, vocab_size=vocab_size)
    if not Path(f"{prefix}.idx").is_file():
        source = data_dir / "reference.jsonl"
        with source.open("w", encoding="utf-8") as out:
            for document in reference_documents():
                out.write(json.dumps({"text": document}) + "\n")
        prepare([source], tokenizer, prefix, workers=1, force=True)
    return str(prefix), str(tokenizer)


def data_layout(prefix: str) -> str:
    """What the prepared post-training data at ``prefix`` holds: prompts, or packed rows
    (``packed_rows``)."""
    from baton.data.packed import data_objective

    kind = data_objective(prefix)
    if kind == DataKind.PROMPTS.value:
        from baton.data.prompts import PreparedPrompts

        return f"{len(PreparedPrompts(prefix))} prompts"
    return packed_rows(prefix, "conversations" if kind == DataKind.CONVERSATIONS else "documents")


def packed_rows(prefix: str, noun: str = "conversations") -> str:
    """How the packed ``noun`` at ``prefix`` are laid out, and that every backend trains
    on all of them (none held out)."""
    from baton.data.packed import PackedDataset

    data = PackedDataset(prefix)
    return (
        f"{data.num_sequences} {noun} packed in {data.num_rows} rows; every backend "
        f"trains on all {data.num_rows} rows, none held out"
    )
