"""Offline data for TorchTitan: its Hugging Face pipeline over local files, a byte
tokenizer and a packed local-text data loader.

``configs.dataloader_config("corpus.jsonl")`` / ``configs.tokenizer_config("tok/")`` give TorchTitan's
own ``HuggingFaceTextDataLoader`` (through its ``DATASETS`` registry, ``datasets`` reading
the local JSON Lines or Parquet file) and its ``HuggingFaceTokenizer`` (``hf_assets_path``
is the tokenizer directory); the loader's state is checkpointed by TorchTitan, so a
resumed run continues with the same batches. Without a tokenizer or data file, the
byte-level defaults below need no files at all.

Both plug into TorchTitan through its own protocols: ``ByteBosEosTokenizer`` is a
``BaseTokenizer`` and ``LocalTextDataLoader`` a ``ParallelAwareDataloader`` (a
``torchdata`` ``StatefulDataLoader``), so TorchTitan's ``CheckpointManager`` saves
the loader's position and a resumed run continues with the same batches.

The default corpus is the Python language reference that ships with CPython
(``pydoc_data.topics``, ~490 kB, one document per topic); ``dataset_path`` reads a
UTF-8 text file instead (documents separated by blank lines). Nothing is downloaded.

Example::

    cfg = llama3_debugmodel()
    cfg.tokenizer = ByteBosEosTokenizer.Config()
    cfg.dataloader = LocalTextDataLoader.Config(dataset_path="corpus.txt")
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer

from baton.backends.torchtitan.rank_items import RankItems
from baton.data import held_out_start
from baton.data.corpus import read_text, reference_documents
from baton.data.shards import check_rank


class ByteBosEosTokenizer(BaseTokenizer):
    """UTF-8 bytes as token ids 0-255, plus BOS (256) and EOS (257): 258 ids, no files."""

    BOS = 256
    EOS = 257

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        pass

    def __init__(self, config: Config | None = None, *, tokenizer_path: str | None = None):
        super().__init__()
        self.config = config
        self.bos_id = self.BOS
        self.eos_id = self.EOS

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return ([self.BOS] if add_bos else []) + ids + ([self.EOS] if add_eos else [])

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def get_vocab_size(self) -> int:
        return 258


def paragraphs(path: str | None) -> list[str]:
    """The corpus as documents, one per blank-line-separated paragraph of the file at
    ``path`` (the built-in reference's topics when ``path`` is ``None``)."""
    if path is None:
        return [doc for doc in reference_documents() if doc.strip()]
    text = read_text(path, "dataloader.dataset_path")
    return [doc for doc in text.split("\n\n") if doc.strip()]


def split_documents(documents: list[Any], eval_split: float, split: str) -> list[Any]:
    """The documents of ``split`` (``train`` or ``eval``) when the last ``eval_split`` of
    them are held out (``baton.data.held_out_start``: the rule of every engine); ``eval``
    with nothing held out is all of them."""
    if split not in ("train", "eval"):
        raise ValueError(f"split {split!r} is neither 'train' nor 'eval'")
    first = held_out_start(len(documents), eval_split)
    if split == "eval" and first == len(documents):
        return documents
    return documents[:first] if split == "train" else documents[first:]


def window_positions(positions: torch.Tensor) -> torch.Tensor:
    """Positions of one window: a document continued from the previous window restarts
    at 0 (RoPE tables cover ``seq_len`` positions), as TorchTitan's text datasets do."""
    positions = positions.clone()
    if positions[0] > 0:
        zeros = (positions == 0).nonzero()
        end = int(zeros[0]) if len(zeros) else len(positions)
        positions[:end] -= positions[0].clone()
    return positions


class PackedTextDataset(IterableDataset, Stateful):
    """Documents tokenized with BOS/EOS and packed into ``seq_len`` windows.

    Yields ``({"input": ids, "positions": pos}, labels)`` like TorchTitan's text
    datasets: labels are inputs shifted by one inside each document, positions
    restart at every document. Documents are dealt round-robin to data-parallel
    ranks; each epoch shuffles them with ``seed + epoch``. The state is
    ``(epoch, window)``.
    """

    def __init__(
        self,
        documents: list[str],
        tokenizer: BaseTokenizer,
        *,
        seq_len: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        seed: int = 0,
        infinite: bool = True,
    ) -> None:
        check_rank(dp_rank, dp_world_size, type(self).__name__)
        self.tokens = [tokenizer.encode(doc, add_bos=True, add_eos=True) for doc in documents]
        self.seq_len = seq_len
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.seed = seed
        self.infinite = infinite
        self.epoch = 0
        self.window = 0
        self._stream = self._build_stream(0)
        #: a finite pass reads as many windows on every rank (no rank waits for another)
        self._finite_windows = min(
            sum(len(ids) - 1 for ids in self.tokens[rank::dp_world_size]) // seq_len
            for rank in range(dp_world_size)
        )
        if self._num_windows() == 0:
            raise ValueError(
                f"the corpus gives rank {dp_rank} fewer than {seq_len} tokens; "
                "use a larger corpus or a smaller training.seq_len"
            )

    def _build_stream(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        order = torch.arange(len(self.tokens))
        if epoch > 0:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = order[torch.randperm(len(order), generator=generator)]
        inputs: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for index in order[self.dp_rank :: self.dp_world_size].tolist():
            ids = self.tokens[index]
            inputs.extend(ids[:-1])
            labels.extend(ids[1:])
            positions.extend(range(len(ids) - 1))
        return torch.tensor(inputs), torch.tensor(labels), torch.tensor(positions)

    def _num_windows(self) -> int:
        windows = len(self._stream[0]) // self.seq_len
        return windows if self.infinite else min(windows, self._finite_windows)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            while self.window < self._num_windows():
                start = self.window * self.seq_len
                end = start + self.seq_len
                self.window += 1
                inputs, labels, positions = (t[start:end] for t in self._stream)
                yield {"input": inputs, "positions": window_positions(positions)}, labels
            if not self.infinite:
                return
            self.epoch += 1
            self.window = 0
            self._stream = self._build_stream(self.epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "window": self.window, "seed": self.seed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["seed"] != self.seed:
            raise ValueError(
                f"data seed {state_dict['seed']} in the checkpoint differs from {self.seed}"
            )
        if state_dict["epoch"] != self.epoch:
            self._stream = self._build_stream(int(state_dict["epoch"]))
        self.epoch = int(state_dict["epoch"])
        self.window = int(state_dict["window"])


@dataclass(frozen=True)
class RankShare:
    """What one data-parallel rank's dataset is cut to: samples of ``seq_len`` tokens,
    rank ``dp_rank`` of ``dp_world_size``."""

    seq_len: int
    dp_rank: int
    dp_world_size: int


class BatonDataLoader(ParallelAwareDataloader):
    """TorchTitan's data-loader protocol, once for every baton loader: the keyword
    arguments TorchTitan's ``build_dataloader`` passes, and the loader settings of the
    ``Config`` (workers, pinning, prefetch) handed on to ``ParallelAwareDataloader``
    unchanged. A subclass defines its ``Config`` and builds its dataset
    (``build_dataset``)."""

    def __init__(
        self,
        config: Any,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: BaseTokenizer,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = 1,
        **kwargs: Any,
    ) -> None:
        dataset = self.build_dataset(config, tokenizer, RankShare(seq_len, dp_rank, dp_world_size))
        items = getattr(dataset, "items", None)  # a prepared dataset's rows or windows
        if isinstance(items, RankItems) and items.infinite:  # training: a batch repeats none
            items.check_batch(local_batch_size)
        super().__init__(
            dataset,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            batch_size=local_batch_size,
            num_workers=config.num_workers,
            persistent_workers=config.persistent_workers,
            pin_memory=config.pin_memory,
            prefetch_factor=config.prefetch_factor,
            snapshot_every_n_steps=snapshot_every_n_steps,
        )

    @classmethod
    def build_dataset(
        cls, config: Any, tokenizer: BaseTokenizer, share: RankShare
    ) -> IterableDataset[Any]:
        """This rank's dataset of ``share.seq_len``-token samples, as ``config`` says."""
        raise NotImplementedError

    @classmethod
    def prepared_path(cls, config: Any) -> str:
        """``config.dataset_path``, the prefix of prepared data (``ValueError`` if unset)."""
        if not config.dataset_path:
            raise ValueError(f"{cls.__name__} needs dataset_path (a prepared PREFIX)")
        return str(config.dataset_path)


class LocalTextDataLoader(BatonDataLoader):
    """TorchTitan data loader over a local text corpus (``PackedTextDataset``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = "local_text"
        dataset_path: str | None = None
        """UTF-8 text file; ``None`` uses the Python language reference."""
        seed: int = 0
        """Seed of the per-epoch document shuffle."""
        infinite: bool = True
        """Loop over the corpus forever (reshuffled each epoch)."""
        eval_split: float = 0.0
        """The fraction of documents held out for evaluation (the last ones; 0: none)."""
        split: str = "train"
        """With ``eval_split``: ``train`` reads the documents before the held-out ones,
        ``eval`` the held-out ones."""

    @classmethod
    def build_dataset(
        cls, config: Config, tokenizer: BaseTokenizer, share: RankShare
    ) -> PackedTextDataset:
        return PackedTextDataset(
            split_documents(paragraphs(config.dataset_path), config.eval_split, config.split),
            tokenizer,
            seq_len=share.seq_len,
            dp_rank=share.dp_rank,
            dp_world_size=share.dp_world_size,
            seed=config.seed,
            infinite=config.infinite,
        )


#: local file formats TorchTitan's Hugging Face text loader reads through ``datasets``
HF_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _load_local(path: str, *, format: str, eval_split: float = 0.0, split: str = "train") -> Any:
    from datasets import load_dataset

    records = load_dataset(format, data_files=path, split="train")
    kept = split_documents(list(range(len(records))), eval_split, split)
    return records if len(kept) == len(records) else records.select(kept)


def register_local_dataset(
    path: str, text_key: str = "text", *, eval_split: float = 0.0, split: str = "train"
) -> str:
    """Register a local JSON Lines / Parquet file in TorchTitan's ``DATASETS`` registry.

    Returns the registry name (``local_json`` / ``local_parquet``, suffixed with the
    text key when it is not ``text``, and with the split when ``eval_split`` holds out
    the last records or ``split`` is ``eval``) for ``HuggingFaceTextDataLoader.Config(dataset=...,
    dataset_path=path)``: TorchTitan's own loader then reads the file through
    ``datasets.load_dataset`` (a map-style dataset: its sample index and token buffers
    are the loader state that checkpoints save). Registering is TorchTitan's documented
    way to add a dataset; the same name always maps to the same loader.
    """
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    suffix = Path(path).suffix.lower()
    if suffix not in HF_FORMATS:
        raise ValueError(
            f"{path}: TorchTitan's Hugging Face loader reads {sorted(HF_FORMATS)} files here; "
            "pass a .jsonl/.json/.parquet file (or a .txt file for the plain-text loader)"
        )
    if not Path(path).is_file():
        raise FileNotFoundError(f"data file {path} does not exist; pass --data-path FILE")
    format = HF_FORMATS[suffix]
    name = f"local_{format}" + ("" if text_key == "text" else f"_{text_key.lower()}")
    if eval_split or split != "train":
        name += f"_{split}_{eval_split:g}"
    DATASETS[name] = DatasetConfig(
        path=path,
        loader=partial(_load_local, format=format, eval_split=eval_split, split=split),
        sample_processor=itemgetter(text_key),
    )
    return name
