"""A recipe over a tiny GPT on the Fabric backend whose cosine schedule is built for
``max_steps``, for resume tests that read the learning rate each step:
``baton run tests/safety/recipe_gpt.py --run-dir /tmp/r --max-steps 12 --lr 2e-3``."""

from __future__ import annotations

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.callbacks import Checkpoint, CompositeLogger
from baton.core import Driver


def recipe(run_dir: str, max_steps: int = 12, lr: float = 2e-3, save_every: int = 6) -> Driver:
    """Tiny GPT, warmup then cosine decay to a tenth of ``lr`` at ``max_steps``."""
    config = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=16),
        batch_size=2,
        lr=lr,
        min_lr_ratio=0.1,
        warmup_steps=2,
        decay_steps=max_steps,
        accelerator="cpu",
        eval_batches=1,
    )
    return Driver(
        config.backend(),
        [Checkpoint(every_n_steps=save_every, keep_last=None), CompositeLogger(["jsonl"])],
        max_steps=max_steps,
        log_every=1,
        run_dir=run_dir,
    )
