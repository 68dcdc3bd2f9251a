"""Your own JAX model under baton: a small flax (nnx) transformer LM on bytes of real text.

The model, the optax optimizer, the loss function and the batches are ordinary JAX code
written here; ``JaxBackend`` jits the step, and the callbacks are the same ones the
PyTorch recipes use (``quickstart.py``). Batches are random windows of the Python
language reference (numpy only); each process draws its own with its own seed.

uv run baton run recipes/jax_tiny.py --max-steps 200
uv run baton run recipes/jax_tiny.py --max-steps 400 --resume auto
BATON_RANK=0 BATON_WORLD_SIZE=2 BATON_MASTER_ADDR=127.0.0.1 BATON_MASTER_PORT=29400 \
    uv run baton run recipes/jax_tiny.py   # and BATON_RANK=1 in a second shell
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from baton.backends.jax import JaxBackend
from baton.callbacks import Checkpoint, CompositeLogger, Preemption, Progress, ThroughputMonitor
from baton.callbacks.sinks.console import ConsoleSink
from baton.core import Callback, Driver
from baton.data.corpus import load_text

#: printed on every log step (the loss visibly falls in any terminal)
CONSOLE_KEYS = ["loss", "eval/loss", "accuracy", "lr", "throughput/tokens_per_s"]


def byte_windows(
    data: np.ndarray, batch_size: int, seq_len: int, seed: int
) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches of random windows: ``inputs`` and next-byte ``targets`` [B, L]."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - seq_len - 1, size=batch_size)
        window = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int32)
        yield {"inputs": window[:, :-1], "targets": window[:, 1:]}


def make_model(d_model: int, heads: int, layers: int, seq_len: int, seed: int):
    """A pre-norm decoder-only transformer over bytes (vocabulary 256), written with nnx."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.norm1 = nnx.LayerNorm(d_model, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(
                num_heads=heads, in_features=d_model, decode=False, rngs=rngs
            )
            self.norm2 = nnx.LayerNorm(d_model, rngs=rngs)
            self.up = nnx.Linear(d_model, 4 * d_model, rngs=rngs)
            self.down = nnx.Linear(4 * d_model, d_model, rngs=rngs)

        def __call__(self, x, mask):
            x = x + self.attn(self.norm1(x), mask=mask)
            return x + self.down(nnx.gelu(self.up(self.norm2(x))))

    class ByteLM(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(256, d_model, rngs=rngs)
            self.pos = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (seq_len, d_model)))
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])
            self.norm = nnx.LayerNorm(d_model, rngs=rngs)

        def __call__(self, tokens):
            x = self.embed(tokens) + self.pos[: tokens.shape[1]]
            mask = nnx.make_causal_mask(tokens)
            for block in self.blocks:
                x = block(x, mask)
            return self.embed.attend(self.norm(x))  # tied output embedding

    return ByteLM(nnx.Rngs(seed))


def loss_fn(model, batch):
    """Next-byte cross-entropy, with the accuracy as a logged metric."""
    import optax

    logits = model(batch["inputs"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
    accuracy = (logits.argmax(-1) == batch["targets"]).mean()
    return loss, {"accuracy": accuracy}


def recipe(
    max_steps: int = 200,
    lr: float = 3e-3,
    batch_size: int = 16,
    seq_len: int = 64,
    layers: int = 2,
    d_model: int = 64,
    heads: int = 4,
    seed: int = 0,
    log_every: int = 25,
    eval_every: int = 100,
    save_every: int = 100,
    async_save: bool = True,
    data_path: str | None = None,
    run_dir: str = "runs/jax_tiny",
    progress: bool = True,
    print_loss: bool = True,
) -> Driver:
    """Train a small nnx transformer on bytes of real English text, on CPU.

    Args:
        max_steps: optimizer steps to train (the warmup-cosine schedule spans them).
        lr: peak learning rate (after warmup).
        batch_size: sequences per step and process.
        seq_len: bytes per sequence.
        layers: transformer blocks.
        d_model: model width.
        heads: attention heads.
        seed: seed of the weights and of the data order.
        log_every: steps between log lines (metrics reach the host only then).
        eval_every: steps between evaluations (0: none).
        save_every: steps between checkpoints (0: only when the run stops).
        async_save: write checkpoints in the background.
        data_path: a UTF-8 text file to train on (None: the Python language reference).
        run_dir: where checkpoints and logs go.
        progress: show the progress bar.
        print_loss: print the loss line on log steps.
    """
    import optax

    _source, text = load_text(data_path)
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    cut = int(len(data) * 0.95)
    train, val = data[:cut], data[cut:]
    warmup = min(20, max_steps // 4)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(max_steps, warmup + 1))

    def train_batches() -> Iterator[dict[str, np.ndarray]]:
        import jax  # called by the backend after jax.distributed is up

        return byte_windows(train, batch_size, seq_len, seed=seed * 1000 + jax.process_index())

    def eval_batches() -> list[dict[str, np.ndarray]]:
        windows = byte_windows(val, batch_size, seq_len, seed=12345)
        return [next(windows) for _ in range(4)]

    backend = JaxBackend(
        model=lambda: make_model(d_model, heads, layers, seq_len, seed),
        optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule)),
        loss_fn=loss_fn,
        train_data=train_batches,
        eval_data=eval_batches,
        lr_schedule=schedule,
        facts={"recipe": "jax_tiny", "d_model": d_model, "layers": layers, "seq_len": seq_len},
    )
    callbacks: list[Callback] = [
        Checkpoint(
            every_n_steps=save_every or None,
            keep_last=2,
            async_save=async_save,
        ),
        Preemption(),
        ThroughputMonitor(),
        CompositeLogger(
            ["jsonl", "tensorboard", *([ConsoleSink(CONSOLE_KEYS)] if print_loss else [])]
        ),
    ]
    if progress:
        callbacks.append(Progress())
    return Driver(
        backend,
        callbacks,
        max_steps=max_steps,
        log_every=log_every,
        eval_every=eval_every or None,
        run_dir=run_dir,
    )
