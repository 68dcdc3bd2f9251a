"""A tiny flax nnx language model, its loss and a fixed list of byte batches, shared by
the JAX-backend tests (small enough to compile in about a second)."""

from __future__ import annotations

import numpy as np

from baton.data.corpus import load_text

SEQ = 16
BATCH = 8


def batches(n: int, seed: int = 0, batch: int = BATCH) -> list[dict[str, np.ndarray]]:
    """``n`` batches of random windows of the byte corpus: ``x`` and next-byte ``y``."""
    data = np.frombuffer(load_text(None)[1].encode("utf-8"), dtype=np.uint8)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        starts = rng.integers(0, len(data) - SEQ - 1, size=batch)
        window = np.stack([data[s : s + SEQ + 1] for s in starts]).astype(np.int32)
        out.append({"x": window[:, :-1], "y": window[:, 1:]})
    return out


def make_model(seed: int = 0):
    """Embedding, a two-layer MLP over each position with a dropout, tied output."""
    from flax import nnx

    class TinyLM(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(256, 32, rngs=rngs)
            self.hidden = nnx.Linear(32, 64, rngs=rngs)
            self.out = nnx.Linear(64, 32, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x):
            h = self.drop(nnx.relu(self.hidden(self.embed(x))))
            return self.embed.attend(self.out(h))

    return TinyLM(nnx.Rngs(seed))


def loss_fn(model, batch):
    import optax

    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
