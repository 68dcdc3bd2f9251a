"""Megatron's own data path: a tokenizer, an indexed dataset (.bin/.idx), GPTDataset.

Two sources of tokens. A prepared dataset (``baton data prepare``) or a blend of them,
read with a Hugging Face tokenizer from a local directory through
``megatron.core.tokenizers`` (``load_tokenizer``); or, with no setup at all, the bytes
of a local text. ``ByteEodTokenizer`` implements Megatron's tokenizer interface over UTF-8 bytes (no
files, no download). ``build_indexed_dataset`` writes Megatron's indexed dataset
(``<prefix>.bin`` + ``<prefix>.idx``) from a text, one document per paragraph group;
``build_gpt_datasets`` builds the train/valid/test ``GPTDataset`` splits through
``BlendedMegatronDatasetBuilder``; ``SampleStream`` hands out micro-batches in
Megatron's pretraining order (consecutive global samples, each data-parallel rank
taking its slice) and its only state is the number of samples consumed, so a resumed
run continues exactly.

Example::

    prefix = build_indexed_dataset("/tmp/data/pyref")            # pydoc_data text
    train, valid, _ = build_gpt_datasets(prefix, seq_len=64, seed=0)
    stream = SampleStream(train, micro_batch_size=4, dp_rank=0, dp_size=1)
    batch = stream.next_micro_batch()   # tokens, labels, loss_mask, position_ids

    source = open_prepared("0.7 data/web 0.3 data/code", "runs/tok")  # checked, not built
    train, valid, _ = build_gpt_datasets(
        source.blend, seq_len=64, seed=0, tokenizer=source.tokenizer, sizes=[800, 40, 40]
    )
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy
import torch
from megatron.core.tokenizers import MegatronTokenizerBase

from baton.data import Blend, DataError, TokenizerInfo, parse_blend
from baton.data import load_tokenizer as load_tokenizer_info
from baton.data.corpus import reference_documents
from baton.data.shards import check_enough_for_ranks, check_rank

#: the end-of-document token that follows every document
EOD = 256


class ByteEodTokenizer(MegatronTokenizerBase):
    """UTF-8 bytes as token ids 0-255 plus an end-of-document id 256.

    Satisfies what Megatron's datasets read from a tokenizer (``vocab_size``, ``eod``);
    there is no pad token, so Megatron uses its own out-of-vocabulary pad id.
    """

    def __init__(self) -> None:
        super().__init__(path="", config={})
        #: what Megatron's dataset cache keys record about the tokenizer (the class's
        #: earlier name, kept so existing dataset caches still match)
        self.unique_identifiers = {"class": "baton.ByteTokenizer", "eod": EOD}

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    @property
    def vocab(self) -> dict[str, int]:
        return {chr(i) if i < 128 else f"<0x{i:02X}>": i for i in range(256)} | {"<eod>": EOD}

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return EOD + 1

    @property
    def eod(self) -> int:
        return EOD

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ByteEodTokenizer has no chat template")


@dataclass(frozen=True)
class PreparedSource:
    """A checked blend of prepared datasets and the tokenizer that reads them."""

    blend: Blend
    #: Megatron's tokenizer (``megatron.core.tokenizers``, Hugging Face library backend)
    tokenizer: Any
    info: TokenizerInfo

    @property
    def vocab_size(self) -> int:
        """Rows the embedding needs: every id the tokenizer can produce."""
        return max(self.info.vocab_size, int(self.tokenizer.vocab_size))


def load_tokenizer(path: str | Path) -> tuple[Any, TokenizerInfo]:
    """A local Hugging Face tokenizer directory as Megatron's tokenizer, plus baton's facts
    about it (vocabulary size, end-of-document id, fingerprint).

    ``MegatronTokenizer.from_pretrained`` with the ``huggingface`` library and the ``gpt``
    model type; the metadata is passed in, so nothing is written into the directory.
    Raises ``DataError`` for a missing directory or one without ``tokenizer.json``.
    """
    from megatron.core.tokenizers import MegatronTokenizer

    info = load_tokenizer_info(path)
    tokenizer = MegatronTokenizer.from_pretrained(
        tokenizer_path=str(info.path),
        metadata_path={"library": "huggingface", "model_type": "gpt"},
    )
    if tokenizer.eod != info.eod_id:
        raise DataError(
            f"tokenizer {info.path}: Megatron reads end-of-document id {tokenizer.eod} but "
            f"{info.eod_token!r} is id {info.eod_id}; set eos_token in tokenizer_config.json"
        )
    return tokenizer, info


def open_prepared(data_path: str | Sequence[str], tokenizer_path: str | Path) -> PreparedSource:
    """Parse a blend (``"PREFIX"`` or ``"0.7 PREFIX_A 0.3 PREFIX_B"``), check that every
    prefix has its ``.bin`` and ``.idx`` and was prepared with this tokenizer, and load it.

    Raises ``DataError`` naming the file and the fix; nothing is built.
    """
    blend = parse_blend(data_path)
    tokenizer, info = load_tokenizer(tokenizer_path)
    from baton.data import PreparedDataset

    for prefix in blend.prefixes:
        PreparedDataset(prefix).check_tokenizer(info)
    return PreparedSource(blend, tokenizer, info)


def default_text() -> tuple[str, list[str]]:
    """The Python language reference shipped with CPython: one document per topic."""
    return "pydoc_data.topics", reference_documents()


def paragraph_groups(path: str | Path) -> list[str]:
    """A UTF-8 text file split into documents at blank-line-separated paragraph groups
    of about 4 kB (so documents are neither single lines nor the whole file)."""
    text = Path(path).read_text(encoding="utf-8")
    documents: list[str] = []
    current: list[str] = []
    size = 0
    for paragraph in text.split("\n\n"):
        current.append(paragraph)
        size += len(paragraph)
        if size >= 4096:
            documents.append("\n\n".join(current))
            current, size = [], 0
    if current:
        documents.append("\n\n".join(current))
    return [d for d in documents if d.strip()]


def build_indexed_dataset(
    prefix: str | Path,
    text_path: str | Path | None = None,
    tokenizer: ByteEodTokenizer | None = None,
) -> str:
    """Write ``<prefix>.bin`` / ``<prefix>.idx`` from a text (default: the Python reference).

    Returns the prefix. Files already there for the same source text are reused
    (a content hash is kept next to them), so every rank and every run may call this.
    """
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tokenizer = tokenizer or ByteEodTokenizer()
    if text_path is None:
        _, documents = default_text()
    else:
        if not Path(text_path).is_file():
            raise FileNotFoundError(
                f"data text file {text_path} does not exist; pass a UTF-8 text file or None "
                "for the built-in Python language reference"
            )
        documents = paragraph_groups(text_path)
    digest = hashlib.sha256("\0".join(documents).encode("utf-8")).hexdigest()[:16]
    prefix = str(prefix)
    stamp = Path(prefix + ".sha")
    if stamp.is_file() and stamp.read_text() == digest and Path(prefix + ".idx").is_file():
        return prefix
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{prefix}.tmp{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=numpy.uint16)
    for document in documents:
        ids = [*tokenizer.tokenize(document), EOD]
        builder.add_document(numpy.asarray(ids, dtype=numpy.uint16), [len(ids)])
    builder.finalize(tmp + ".idx")
    Path(tmp + ".bin").replace(prefix + ".bin")
    Path(tmp + ".idx").replace(prefix + ".idx")
    stamp.write_text(digest)
    return prefix


def build_gpt_datasets(
    prefix: str | Blend | None,
    *,
    seq_len: int,
    seed: int,
    split: str = "969,30,1",
    tokenizer: Any = None,
    sizes: Sequence[int | None] | None = None,
    mock: bool = False,
) -> list[Any]:
    """Train / valid / test ``GPTDataset`` through Megatron's builder (a ``BlendedDataset``
    over several prefixes).

    ``prefix`` is one prefix or a ``Blend``; ``sizes`` the samples per split (``None``:
    one epoch each, which a weighted blend cannot have); ``tokenizer`` defaults to bytes.
    ``mock=True`` builds Megatron's ``MockGPTDataset`` (synthetic tokens) instead.
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    if not mock and prefix is None:
        raise ValueError("build_gpt_datasets needs an indexed dataset prefix (or mock=True)")
    if isinstance(prefix, Blend):
        blend: tuple[list[str], list[float] | None] | None = prefix.megatron()
        if prefix.weights is not None and (sizes is None or None in sizes):
            raise ValueError(
                f"the weighted blend {prefix} needs a sample count per split "
                "(config.data.train_samples: steps x global batch size)"
            )
    else:
        blend = None if prefix is None else ([prefix], None)
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_len,
        blend=None if mock else blend,
        split=split,
        tokenizer=tokenizer or ByteEodTokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        path_to_cache=None,
    )
    # sizes None: one epoch of each split (mock data needs explicit sizes)
    if sizes is None:
        sizes = [10_000, 1_000, 100] if mock else [None, None, None]
    cls = MockGPTDataset if mock else GPTDataset
    return BlendedMegatronDatasetBuilder(cls, list(sizes), lambda: True, config).build()


class TrainStream(Protocol):
    """What a training step reads micro-batches from (one per model chunk): a
    ``SampleStream`` over a dataset, or a ``rollout_rows.RolloutStream`` of the step's
    rollouts. ``consumed`` counts the global samples read (a checkpoint records it)."""

    consumed: int

    def __next__(self) -> dict[str, torch.Tensor]: ...

    def take_wait(self) -> float:
        """Seconds spent reading micro-batches since the last call."""
        ...

    def state_dict(self) -> dict[str, int]: ...

    def load_state_dict(self, state: dict[str, int]) -> None: ...


class SampleStream:
    """Micro-batches of a dataset in Megatron's pretraining order, resumable.

    Global sample ``consumed + dp_rank * micro_batch_size + i`` goes to rank
    ``dp_rank``; after each micro-batch every rank advances by
    ``micro_batch_size * dp_size``. Past the end it starts the epoch again.
    """

    def __init__(self, dataset: Any, *, micro_batch_size: int, dp_rank: int, dp_size: int) -> None:
        check_rank(dp_rank, dp_size, "SampleStream")
        check_enough_for_ranks(
            len(dataset),
            dp_size,
            what=f"dataset has {len(dataset)} samples",
            fix="use a longer text or a smaller seq_len / micro_batch_size",
            per_rank=micro_batch_size,
        )
        self.dataset = dataset
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.consumed = 0
        #: seconds spent reading micro-batches since the last ``take_wait``
        self.waited_s = 0.0

    def next_micro_batch(self) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        start = self.consumed + self.dp_rank * self.micro_batch_size
        samples = [
            self.dataset[(start + i) % len(self.dataset)] for i in range(self.micro_batch_size)
        ]
        self.consumed += self.micro_batch_size * self.dp_size
        # torch.as_tensor: a BlendedDataset adds a numpy "dataset_id" to each sample
        batch = {key: torch.stack([torch.as_tensor(s[key]) for s in samples]) for key in samples[0]}
        self.waited_s += time.perf_counter() - started
        return batch

    def take_wait(self) -> float:
        """Seconds spent reading micro-batches since the last call (a step's data wait)."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    def __iter__(self) -> SampleStream:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return self.next_micro_batch()

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed, "dp_size": self.dp_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.consumed = int(state["consumed"])


def check_split_not_empty(source: PreparedSource, split: str) -> None:
    """Megatron's GPTDataset loops forever drawing samples from a split without documents;
    refuse such a split (as Megatron's builder cuts it: rounded shares of the documents)."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    from baton.data import DataError, PreparedDataset

    names = ("train", "valid", "test")
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    for prefix in source.blend.prefixes:
        documents = PreparedDataset(prefix).num_documents
        for name, share in zip(names, matrix, strict=True):
            if share is None:
                continue
            begin, end = (round(bound * documents) for bound in share)
            if end <= begin:
                raise DataError(
                    f"{prefix} has {documents} document(s): its {name} share of split "
                    f"{split!r} is empty (Megatron splits whole documents). Prepare more "
                    "documents (a .txt file is one document unless prepared with "
                    "`baton data prepare FILE.txt --txt-split paragraph` or `line`), or "
                    "change the split (--set data.split=100,0,0 trains on all of it, "
                    "without evaluation)"
                )


def data_fingerprint(data: Any, source: PreparedSource | None) -> str:
    """A short hash of what the run trains on: the blend's files (names, sizes, weights)
    and the tokenizer's fingerprint, or the text file (name, size) and the kind of data.
    A resume on other data is refused with it (``baton.core.checkpoint_record``)."""
    if source is not None:
        files = [
            (Path(prefix + suffix).name, Path(prefix + suffix).stat().st_size)
            for prefix in source.blend.prefixes
            for suffix in (".bin", ".idx")
            if Path(prefix + suffix).exists()
        ]
        facts: dict[str, Any] = {
            "files": files,
            "weights": source.blend.weights,
            "tokenizer": source.info.fingerprint,
        }
    else:
        text = Path(data.text_path) if data.text_path else None
        size = text.stat().st_size if text is not None and text.exists() else None
        facts = {"kind": data.kind, "text": text.name if text else None, "size": size}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
