"""Quickstart: a small byte-level GPT on the Python language reference, on CPU in about a minute.

uv run baton run recipes/quickstart.py
uv run baton run recipes/quickstart.py --max-steps 600 --resume auto --allow-changed max_steps
"""

from __future__ import annotations

from baton.backends.fabric import FabricBackend, FabricConfig, GPTConfig
from baton.callbacks import standard_callbacks
from baton.core import Driver


def recipe(
    max_steps: int = 300,
    lr: float = 2e-3,
    batch_size: int = 16,
    seq_len: int = 128,
    n_layer: int = 4,
    d_model: int = 128,
    n_head: int = 4,
    seed: int = 0,
    log_every: int = 25,
    eval_every: int = 100,
    save_every: int = 100,
    data_path: str | None = None,
    run_dir: str = "runs/quickstart",
    progress: bool = True,
) -> Driver:
    """Train a small GPT on bytes of real English text (the Python language reference)."""
    config = FabricConfig(
        model=GPTConfig(n_layer=n_layer, d_model=d_model, n_head=n_head, seq_len=seq_len),
        data_path=data_path,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        warmup_steps=min(20, max_steps),
        decay_steps=max_steps,
        accelerator="cpu",
    )
    return Driver(
        FabricBackend(config),
        standard_callbacks(save_every=save_every, progress=progress),
        max_steps=max_steps,
        log_every=log_every,
        eval_every=eval_every,
        run_dir=run_dir,
    )
