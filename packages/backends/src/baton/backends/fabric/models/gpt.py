"""The quickstart's pieces: a small GPT, byte windows of the built-in corpus, AdamW
with a warmup-cosine schedule. None of it is part of the backend; recipes pass these
to ``FabricBackend`` like any user's own model and data.

Example::

    model = GPT(GPTConfig(n_layer=4, d_model=128, n_head=4, vocab_size=256, seq_len=128))
    loss = model(tokens[:, :-1], tokens[:, 1:])

    train, val = byte_loaders(seq_len=128, batch_size=16, seed=0)    # the Python reference
    backend = GPTTraining(model=GPTConfig(n_layer=2), batch_size=8).backend()
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from baton.data.corpus import load_text


@dataclass
class GPTConfig:
    """Shape of the model; recorded in checkpoints so a mismatched resume fails clearly."""

    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    vocab_size: int = 256
    seq_len: int = 128
    dropout: float = 0.0

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def num_params(self) -> int:
        d, layers = self.d_model, self.n_layer
        per_layer = 12 * d * d + 13 * d  # attention + mlp weights, biases, two norms
        return layers * per_layer + self.vocab_size * d + self.seq_len * d + 2 * d

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 x parameters + attention (the PaLM estimate)."""
        return 6.0 * self.num_params() + 12.0 * self.n_layer * self.d_model * self.seq_len


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by n_head={cfg.n_head}")
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of ``targets`` given ``idx`` (both [B, T])."""
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


# -- data: byte windows of the built-in corpus (or any UTF-8 file) ----------------------------
class ByteWindows(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` bytes: item ``i`` is ``(x, y)``, the
    window without its last byte and without its first (next-byte targets)."""

    def __init__(self, data: torch.Tensor, seq_len: int) -> None:
        self.data = data
        self.seq_len = seq_len

    def __len__(self) -> int:
        return max(0, (len(self.data) - 1) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.seq_len
        window = self.data[start : start + self.seq_len + 1]
        return window[:-1], window[1:]


def byte_splits(path: str | Path | None = None, val_fraction: float = 0.05) -> tuple[Any, Any]:
    """``(train, val)`` byte tensors (int64) of the corpus (``baton.data.corpus``)."""
    _, text = load_text(path)
    data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()
    split = int(len(data) * (1 - val_fraction))
    return data[:split], data[split:]


def byte_loaders(
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    eval_batches: int = 8,
    path: str | Path | None = None,
) -> tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A shuffled, resumable training loader (torchdata's ``StatefulDataLoader``: its
    state is the data position in checkpoints) and a fixed list of validation batches."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    train, val = byte_splits(path)
    windows = ByteWindows(train, seq_len)
    if len(windows) < batch_size:
        raise ValueError(
            f"corpus of {len(train)} bytes has {len(windows)} windows of {seq_len}, fewer than "
            f"one batch ({batch_size}); use a smaller seq_len or batch_size"
        )
    loader = StatefulDataLoader(
        windows,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return loader, eval_windows(val, seq_len=seq_len, batch_size=batch_size, batches=eval_batches)


def eval_windows(
    data: torch.Tensor, *, seq_len: int, batch_size: int, batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of evenly spaced validation windows (the same every evaluation)."""
    count = min(batch_size * batches, (len(data) - 1) // seq_len)
    if count == 0:
        return []
    starts = torch.linspace(0, len(data) - seq_len - 2, count).long()
    windows = data[starts[:, None] + torch.arange(seq_len + 1)]
    return [(w[:, :-1], w[:, 1:]) for w in windows.split(batch_size)]


# -- optimizer and schedule ---------------------------------------------------------------------
def adamw(
    lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95)
) -> Callable[[nn.Module], torch.optim.Optimizer]:
    """An optimizer factory: AdamW, weight decay on matrices only."""

    def make(model: nn.Module) -> torch.optim.Optimizer:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)

    return make


def warmup_cosine(
    warmup_steps: int, decay_steps: int | None, min_lr_ratio: float = 0.1
) -> Callable[[torch.optim.Optimizer], Any]:
    """A scheduler factory: linear warmup, then cosine decay to ``min_lr_ratio`` at
    ``decay_steps`` (``None``: constant after warmup)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if decay_steps is None:
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, decay_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# -- all of it as one backend (tests and benchmarks) -------------------------------------------
@dataclass
class GPTTraining:
    """The quickstart's settings in one object; ``backend()`` hands the pieces to
    ``FabricBackend``. The model is built in ``setup`` from ``model`` as it is then."""

    model: GPTConfig = field(default_factory=GPTConfig)
    data_path: str | None = None
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 20
    decay_steps: int | None = None
    grad_clip: float | None = 1.0
    seed: int = 0
    eval_batches: int = 8
    accelerator: str = "auto"
    devices: int | str | None = None
    num_nodes: int | None = None
    strategy: str = "auto"
    precision: str = "32-true"

    def backend(self, cls: type | None = None) -> Any:
        """A ``FabricBackend`` (or the subclass ``cls``) training this GPT on the bytes."""
        from baton.backends.fabric.backend import FabricBackend, FabricConfig

        if self.model.vocab_size < 256:
            raise ValueError(
                f"byte-level data needs vocab_size >= 256, got {self.model.vocab_size}"
            )
        train, val = byte_loaders(
            seq_len=self.model.seq_len,
            batch_size=self.batch_size,
            seed=self.seed,
            eval_batches=self.eval_batches,
            path=self.data_path,
        )
        return (cls or FabricBackend)(
            model=lambda: GPT(self.model),
            optimizer=adamw(self.lr, self.weight_decay, self.betas),
            scheduler=warmup_cosine(self.warmup_steps, self.decay_steps, self.min_lr_ratio),
            data=train,
            eval_data=val,
            flops_per_token=self.model.flops_per_token(),
            describe={"model": self.model.to_dict()},
            config=FabricConfig(
                accelerator=self.accelerator,
                devices=self.devices,
                num_nodes=self.num_nodes,
                strategy=self.strategy,
                precision=self.precision,
                grad_accum=self.grad_accum,
                grad_clip=self.grad_clip,
                seed=self.seed,
            ),
        )
