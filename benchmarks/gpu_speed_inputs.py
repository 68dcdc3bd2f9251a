"""What ``gpu_speed.py`` trains on, built locally: a random-weight Qwen3 in Qwen3-0.6B's
shape, a Llama for Megatron-Core, a small BPE tokenizer (prepared data records its
fingerprint; the token ids need no more), packed SFT rows, preference pairs two to a
row, and tokenized text for Megatron's pretraining data.

Example::

    inputs = Inputs(Path("/tmp/gpu-speed"), REAL)   # or TINY: the same, small
    inputs.qwen3()          # save_pretrained directory (596 M parameters at REAL)
    inputs.sft()            # (prefix of packed SFT rows, the same documents for TRL)
    inputs.pairs()          # (prefix of preference rows, the same pairs as TRL's text)
    inputs.llama()          # Megatron-Core's --model-config directory
    inputs.pretraining()    # a prepared pretraining prefix

Every builder runs once per ``Inputs`` (the result is kept) and only for the rows asked.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from benchmarks.posttrain import WORDS, pair_documents, sft_documents, write_rows


@dataclass(frozen=True)
class Decoder:
    """A decoder's shape (``head_dim`` None: hidden / heads)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int | None = None

    @property
    def attention_width(self) -> int:
        """Query heads x head dimension: the width attention's two matmuls run at."""
        return self.heads * (self.head_dim or self.hidden // self.heads)


@dataclass(frozen=True)
class Shape:
    """One run's sizes: the models, the rows and the steps (``timed_from`` to ``steps``
    timed)."""

    qwen3: Decoder
    llama: Decoder
    seq_len: int
    rows: int
    pairs: int
    steps: int
    timed_from: int

    @property
    def timed_steps(self) -> int:
        return self.steps - self.timed_from + 1

    @property
    def step_tokens(self) -> int:
        """Tokens a step trains: ``rows`` of ``seq_len``."""
        return self.rows * self.seq_len


#: Qwen3-0.6B's shape (596 M parameters, tied embeddings); a 0.55 B Llama (untied, Llama
#: 3's vocabulary); packed rows of 4,096 tokens, 4 a step, 8 DPO pairs a step
REAL = Shape(
    qwen3=Decoder(28, 1024, 3072, 16, 8, 151936, head_dim=128),
    llama=Decoder(24, 1024, 2816, 16, 8, 128256),
    seq_len=4096, rows=4, pairs=8, steps=15, timed_from=4,
)  # fmt: skip
#: the same code paths at a size a CPU trains in seconds
TINY = Shape(
    qwen3=Decoder(2, 64, 128, 4, 2, 512, head_dim=16),
    llama=Decoder(2, 64, 176, 4, 2, 512),
    seq_len=128, rows=4, pairs=8, steps=5, timed_from=3,
)  # fmt: skip


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


class Inputs:
    """The models, tokenizer and data of one run under ``root``, built when first asked."""

    def __init__(self, root: Path, shape: Shape) -> None:
        self.root, self.shape = root, shape
        root.mkdir(parents=True, exist_ok=True)

    @cached_property
    def tokenizer(self) -> Path:
        """A 512-token byte-level BPE trained on the benchmark's words."""
        from baton.data import train_tokenizer

        rng = random.Random(0)
        texts = [_words(rng, 40) for _ in range(200)]
        return train_tokenizer(self.root / "tok", vocab_size=512, texts=texts).path

    @cached_property
    def hf_tokenizer(self) -> Any:
        import transformers

        return transformers.AutoTokenizer.from_pretrained(self.tokenizer)

    @cached_property
    def vocab(self) -> int:
        from baton.data import load_tokenizer

        return load_tokenizer(self.tokenizer).vocab_size

    def qwen3(self) -> Path:
        """A random-weight Qwen3 of ``shape.qwen3`` (fp32, tied embeddings)."""
        directory = self.root / "qwen3"
        if not (directory / "config.json").exists():
            import torch
            import transformers

            d = self.shape.qwen3
            config = transformers.Qwen3Config(
                vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.intermediate,
                num_hidden_layers=d.layers, num_attention_heads=d.heads,
                num_key_value_heads=d.kv_heads, head_dim=d.head_dim or d.hidden // d.heads,
                max_position_embeddings=max(40960, 2 * self.shape.seq_len),
                tie_word_embeddings=True,
            )  # fmt: skip
            torch.manual_seed(0)
            transformers.Qwen3ForCausalLM(config).save_pretrained(directory)
        return directory

    def llama(self) -> Path:
        """A Llama ``config.json`` of ``shape.llama`` (Megatron-Core's ``--model-config``)."""
        directory = self.root / "llama"
        if not (directory / "config.json").exists():
            import transformers

            d = self.shape.llama
            transformers.LlamaConfig(
                vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.intermediate,
                num_hidden_layers=d.layers, num_attention_heads=d.heads,
                num_key_value_heads=d.kv_heads, max_position_embeddings=2 * self.shape.seq_len,
                tie_word_embeddings=False, rms_norm_eps=1e-5,
            ).save_pretrained(directory)  # fmt: skip
        return directory

    def _rows_needed(self) -> int:
        """Rows for every step and two more (a loader may hold some back)."""
        return (self.shape.steps + 2) * self.shape.rows

    @cached_property
    def _sft(self) -> tuple[Path, list[tuple[list[int], list[int]]]]:
        shape = self.shape
        count = 4 * self._rows_needed()  # documents average ~1/3 of a row
        while True:
            docs = sft_documents(count, shape.seq_len, self.vocab)
            prefix = self.root / "data" / "sft"
            rows = write_rows(prefix, [[d] for d in docs], "sft", shape.seq_len, self.tokenizer)
            if rows >= self._rows_needed():
                return prefix, docs
            count *= 2

    def sft(self) -> tuple[Path, list[tuple[list[int], list[int]]]]:
        """Packed SFT rows of ``seq_len + 1`` tokens (best-fit decreasing) and the same
        documents, each ``(ids, completion mask)``, for TRL to pack itself."""
        return self._sft

    @cached_property
    def _pairs(self) -> tuple[Path, list[dict[str, str]]]:
        from baton.data import load_tokenizer
        from baton.data.packed import write_packed

        shape = self.shape
        per_row = shape.pairs // shape.rows
        budget = (shape.seq_len + 1) // per_row  # tokens one pair may take in its row
        high = max(2, (budget - 4) // 4)  # words; about one token each
        low = max(1, high * 3 // 4)
        rng = random.Random(2)
        kept: list[tuple[dict[str, str], list[tuple[list[int], list[int]]]]] = []
        while len(kept) < self._rows_needed() * per_row:
            pair = {
                "prompt": _words(rng, rng.randint(low, high)),
                "chosen": " " + _words(rng, rng.randint(low, high)),
                "rejected": " " + _words(rng, rng.randint(low, high)),
            }
            docs = pair_documents(self.hf_tokenizer, pair)  # as TRL tokenizes it
            if sum(len(ids) for ids, _ in docs) <= budget and pair["chosen"] != pair["rejected"]:
                kept.append((pair, docs))
        rows = [
            [doc for _, docs in kept[i : i + per_row] for doc in docs]
            for i in range(0, len(kept), per_row)
        ]
        prefix = self.root / "data" / "pairs"
        write_packed(
            prefix, rows, objective="preference", seq_len=shape.seq_len,
            tokenizer=load_tokenizer(self.tokenizer),
        )  # fmt: skip
        return prefix, [pair for pair, _ in kept]

    def pairs(self) -> tuple[Path, list[dict[str, str]]]:
        """Preference rows, ``pairs / rows`` pairs to a row (chosen, rejected, chosen,
        ...), and the same pairs as text (TRL tokenizes them itself, to the same ids)."""
        return self._pairs

    @cached_property
    def _pretraining(self) -> Path:
        from baton.tools.data.prepare import prepare

        shape = self.shape
        rng = random.Random(3)
        tokens = 2 * self._rows_needed() * (shape.seq_len + 1)
        per_document = 1000
        corpus = self.root / "corpus.jsonl"
        lines = (
            json.dumps({"text": _words(rng, per_document)})
            for _ in range(tokens // per_document + 1)
        )
        corpus.write_text("".join(line + "\n" for line in lines))
        prefix = self.root / "data" / "corpus"
        prepare([corpus], self.tokenizer, prefix, workers=1)
        return prefix

    def pretraining(self) -> Path:
        """A prepared pretraining prefix (``baton data prepare``) with tokens for every
        step twice over."""
        return self._pretraining
