"""A tiny Llama-shaped flax nnx model with the Hugging Face module names
(``layers.0.self_attn.o_proj.kernel``, ``layers.0.mlp.up_proj.kernel``), no dropout, for
the JAX backend's model-state tests and the one-callback-on-every-backend test.

    model = tiny_llama_nnx(seed=0, o_proj=hf_o_proj_weights)   # optional HF weights
    backend = JaxBackend(model=model, optimizer=optax.sgd(0.1), loss_fn=next_token_loss,
                         train_data=token_batches(4), lr_schedule=lambda step: 0.1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

VOCAB = 64
HIDDEN = 16
LAYERS = 2
SEQ = 8


def tiny_llama_nnx(
    seed: int = 0, *, layers: int = LAYERS, hidden: int = HIDDEN, o_proj: Sequence[Any] = ()
) -> Any:
    """Embedding, ``layers`` pre-norm blocks (single-head causal attention, a SwiGLU-free
    MLP), a final norm and an untied head; ``o_proj`` gives the attention output
    projections' weights in torch layout ``[out, in]`` (Hugging Face's)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    rngs = nnx.Rngs(seed)

    class Attention(nnx.Module):
        def __init__(self) -> None:
            self.q_proj = nnx.Linear(hidden, hidden, use_bias=False, rngs=rngs)
            self.k_proj = nnx.Linear(hidden, hidden, use_bias=False, rngs=rngs)
            self.v_proj = nnx.Linear(hidden, hidden, use_bias=False, rngs=rngs)
            self.o_proj = nnx.Linear(hidden, hidden, use_bias=False, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            scores = q @ jnp.swapaxes(k, -1, -2) / np.sqrt(hidden)
            causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
            weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
            return self.o_proj(weights @ v)

    class Mlp(nnx.Module):
        def __init__(self) -> None:
            self.up_proj = nnx.Linear(hidden, 2 * hidden, use_bias=False, rngs=rngs)
            self.down_proj = nnx.Linear(2 * hidden, hidden, use_bias=False, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.down_proj(jax.nn.silu(self.up_proj(x)))

    class Layer(nnx.Module):
        def __init__(self) -> None:
            self.input_layernorm = nnx.RMSNorm(hidden, rngs=rngs)
            self.self_attn = Attention()
            self.post_attention_layernorm = nnx.RMSNorm(hidden, rngs=rngs)
            self.mlp = Mlp()

        def __call__(self, x: Any) -> Any:
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class TinyLlama(nnx.Module):
        def __init__(self) -> None:
            self.embed_tokens = nnx.Embed(VOCAB, hidden, rngs=rngs)
            self.layers = nnx.List([Layer() for _ in range(layers)])
            self.norm = nnx.RMSNorm(hidden, rngs=rngs)
            self.lm_head = nnx.Linear(hidden, VOCAB, use_bias=False, rngs=rngs)

        def __call__(self, tokens: Any) -> Any:
            x = self.embed_tokens(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.norm(x))

    model = TinyLlama()
    for layer, weight in zip(model.layers, o_proj, strict=False):
        layer.self_attn.o_proj.kernel.set_value(jnp.asarray(np.asarray(weight).T))
    return model


def next_token_loss(model: Any, batch: dict[str, Any]) -> Any:
    import optax

    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def token_batches(n: int, *, seed: int = 0, batch: int = 4) -> list[dict[str, np.ndarray]]:
    """``n`` fixed batches of random tokens: ``x`` and the next tokens ``y``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        window = rng.integers(0, VOCAB, size=(batch, SEQ + 1)).astype(np.int32)
        out.append({"x": window[:, :-1], "y": window[:, 1:]})
    return out
