"""Tokenized text for the Fabric backend: fixed windows of packed documents, resumable.

Two sources, one shape: every item is ``(x, y)``, ``seq_len`` token ids and the same
shifted by one (next-token targets), cut from documents packed back to back (each ends
with the tokenizer's end-of-document id).

- a prepared dataset (``baton data prepare``: Megatron's ``PREFIX.bin`` + ``PREFIX.idx``),
  memory-mapped through ``baton.data.PreparedDataset``; a blend
  (``"0.7 PREFIX_A 0.3 PREFIX_B"``) interleaves the datasets' windows in proportion;
- local ``.jsonl``/``.json``/``.parquet``/``.txt`` files read with ``datasets`` and
  tokenized with the tokenizer directory (``datasets.map``, cached by ``datasets``).

``text_loaders`` wraps either in ``GlobalBatches`` (one seeded global order; its global
position is in every checkpoint, so a run resumes on another number of ranks at the next
sample); evaluation reads held-out documents only when asked (``eval_split``, the last
documents, or ``eval_data_path``): nothing is held out otherwise, as on every engine.

Example::

    train, val, vocab = text_loaders("data/corpus", "runs/tok", seq_len=256, batch_size=8)
    train, val, vocab = text_loaders("docs.jsonl", "runs/tok", seq_len=256, batch_size=8,
                                     eval_split=0.05)    # val: the last 5% of the documents
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

#: files read through ``datasets.load_dataset`` (builder name by suffix)
TEXT_FILES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}


class TokenWindows(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens over a token array (a memory map
    is read only where a window is asked for)."""

    def __init__(self, tokens: Any, seq_len: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range (0..{len(self) - 1})")
        start = index * self.seq_len
        window = torch.from_numpy(
            np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)
        )
        return window[:-1], window[1:]


class Blended(Dataset):
    """Items of several datasets interleaved in proportion to ``weights``, in a fixed order:
    item ``j`` of dataset ``i`` sits at the rank of ``(j + 0.5) / weight_i`` among all such
    keys, so every prefix of the blend holds the datasets in about the asked proportions.
    Its length is as long as the scarcest dataset (relative to its weight) allows."""

    def __init__(self, parts: list[Dataset], weights: list[float]) -> None:
        lengths = [len(part) for part in parts]  # type: ignore[arg-type]
        total = int(min(n / w for n, w in zip(lengths, weights, strict=True)))
        counts = [min(n, int(total * w)) for n, w in zip(lengths, weights, strict=True)]
        keys = np.concatenate(
            [(np.arange(c) + 0.5) / w for c, w in zip(counts, weights, strict=True)]
        )
        which = np.concatenate([np.full(c, i) for i, c in enumerate(counts)])
        local = np.concatenate([np.arange(c) for c in counts])
        order = np.argsort(keys, kind="stable")
        self.parts = parts
        self.which, self.local = which[order], local[order]

    def __len__(self) -> int:
        return len(self.which)

    def __getitem__(self, index: int) -> Any:
        return self.parts[int(self.which[index])][int(self.local[index])]


def prepared_windows(
    spec: str, tokenizer: Any, seq_len: int, *, eval_split: float = 0.0, split: str = "all"
) -> Dataset:
    """Windows of a prepared dataset or blend; the data must have been prepared with
    ``tokenizer`` (its fingerprint is checked against the manifest). ``split``
    ``train`` / ``eval``: the documents before / after the last ``eval_split`` of each
    prefix's documents (``baton.data.held_out_tokens``); ``all``: every token."""
    from baton.data import PreparedDataset, held_out_tokens, parse_blend
    from baton.data.packed import check_objective

    blend = parse_blend(spec)
    parts: list[Dataset] = []
    for prefix in blend.prefixes:
        check_objective(prefix, "pretrain")  # post-training data: DataError naming the fix
        data = PreparedDataset(prefix)
        data.check_tokenizer(tokenizer)
        cut = held_out_tokens(data, eval_split) if split != "all" else 0
        tokens = data.tokens[:cut] if split == "train" else data.tokens[cut:]
        parts.append(TokenWindows(tokens, seq_len))
    if len(parts) == 1:
        return parts[0]
    return Blended(parts, list(blend.normalized_weights()))


def file_windows(
    files: list[str],
    tokenizer: Any,
    seq_len: int,
    text_key: str = "text",
    *,
    eval_split: float = 0.0,
    split: str = "all",
) -> Dataset:
    """Windows of local text files tokenized with ``datasets`` (``.jsonl``, ``.json``,
    ``.parquet``: the ``text_key`` column; ``.txt``: one document per line). ``split``
    ``train`` / ``eval``: the records before / after the last ``eval_split`` of them
    (``baton.data.held_out_start``); ``all``: every record."""
    import datasets

    suffixes = {Path(f).suffix for f in files}
    if len(suffixes) != 1 or next(iter(suffixes)) not in TEXT_FILES:
        raise ValueError(
            f"--data-path files must share one of the suffixes {sorted(TEXT_FILES)}, got "
            f"{sorted(suffixes)}; or give a prepared dataset prefix (baton data prepare)"
        )
    for file in files:
        if not Path(file).is_file():
            raise FileNotFoundError(f"--data-path file {file} does not exist")
    builder = TEXT_FILES[next(iter(suffixes))]
    key = "text" if builder == "text" else text_key
    raw = datasets.load_dataset(builder, data_files=files, split="train")
    if key not in raw.column_names:
        raise ValueError(
            f"{files[0]} has no {key!r} field (it has {raw.column_names}); pass --text-key"
        )
    if split != "all":
        from baton.data import held_out_start

        first = held_out_start(len(raw), eval_split, source=",".join(files))
        raw = raw.select(range(first) if split == "train" else range(first, len(raw)))
    encoder, eod = tokenizer.tokenizer, tokenizer.eod_id

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return {"ids": [[*e.ids, eod] for e in encoder.encode_batch(batch[key])]}

    ids = raw.map(encode, batched=True, remove_columns=raw.column_names)
    tokens = np.fromiter(
        (t for row in ids["ids"] for t in row), dtype=np.int64, count=sum(map(len, ids["ids"]))
    )
    return TokenWindows(tokens, seq_len)


def windows_of(
    data_path: str,
    tokenizer: Any,
    seq_len: int,
    text_key: str = "text",
    *,
    eval_split: float = 0.0,
    split: str = "all",
) -> Dataset:
    """Windows of text files or of a prepared dataset or blend (``split`` as in
    ``prepared_windows``)."""
    files = data_path.split(",")
    if all(Path(f).suffix in TEXT_FILES for f in files):
        return file_windows(files, tokenizer, seq_len, text_key, eval_split=eval_split, split=split)
    return prepared_windows(data_path, tokenizer, seq_len, eval_split=eval_split, split=split)


def batches_of(windows: Any, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The full batches of ``batch_size`` windows in order (the remainder left out, so the
    mean of the batch losses is the mean over every evaluated token)."""
    batches = []
    for start in range(0, len(windows) - batch_size + 1, batch_size):
        chunk = [windows[i] for i in range(start, start + batch_size)]
        batches.append((torch.stack([x for x, _ in chunk]), torch.stack([y for _, y in chunk])))
    return batches


def text_loaders(
    data_path: str,
    tokenizer_dir: str,
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    text_key: str = "text",
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
) -> tuple[Any, list[tuple[torch.Tensor, torch.Tensor]] | None, int]:
    """``(train loader, validation batches, tokenizer vocabulary size)``: shuffled
    ``GlobalBatches`` of ``batch_size`` per rank over the training windows, and the
    evaluation's fixed batches: every full batch of ``eval_data_path`` when given, else of
    the last ``eval_split`` of the documents (held out from training), else ``None``:
    nothing is held out unless asked, and every window trains."""
    from baton.backends.fabric.elastic import GlobalBatches
    from baton.data import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    if eval_split or eval_data_path is not None:
        split = "train" if eval_split else "all"
        windows = windows_of(
            data_path, tokenizer, seq_len, text_key, eval_split=eval_split, split=split
        )
        held = (
            windows_of(data_path, tokenizer, seq_len, text_key, eval_split=eval_split, split="eval")
            if eval_data_path is None
            else windows_of(eval_data_path, tokenizer, seq_len, text_key)
        )
        val = batches_of(held, batch_size)
        if not val or len(windows) < batch_size:  # type: ignore[arg-type]
            raise ValueError(
                f"{eval_data_path or data_path}: too few windows of {seq_len} tokens for a "
                f"batch of {batch_size} to train and one to evaluate; use a smaller --seq-len "
                "or --batch-size, a larger --eval-split, or more data"
            )
        train = GlobalBatches(windows, batch_size=batch_size, seed=seed)
        return train, val, tokenizer.vocab_size
    files = data_path.split(",")
    if all(Path(f).suffix in TEXT_FILES for f in files):
        windows = file_windows(files, tokenizer, seq_len, text_key)
    else:
        windows = prepared_windows(data_path, tokenizer, seq_len)
    total = len(windows)  # type: ignore[arg-type]
    if total < batch_size:
        raise ValueError(
            f"{data_path} holds {total} windows of {seq_len} tokens, too few for batches of "
            f"{batch_size}; use a smaller --seq-len or --batch-size, or more data"
        )
    return GlobalBatches(windows, batch_size=batch_size, seed=seed), None, tokenizer.vocab_size
