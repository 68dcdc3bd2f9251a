"""Test recipe for node-local run directories: the scale-out GPT (Fabric DDP on the
launched CPU ranks) whose run directory is ``RUN_DIR/node<N>``, N the torchrun agent's
node (``GROUP_RANK``), as each node of a cluster would have its own local disk
(``--dir-per rank``: ``RUN_DIR/rank<R>``, a directory per rank).

uv run torchrun --nnodes 2 --node-rank I ... -m baton.core.cli.command run \\
    tests/storage/recipe_nodes.py --run-dir /tmp/r --checkpoint-upload s3://bucket/run
"""

from __future__ import annotations

import os
from pathlib import Path

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.callbacks import Checkpoint
from baton.core import Driver


def recipe(
    run_dir: str, max_steps: int = 10, every_n_steps: int = 5, dir_per: str = "node"
) -> Driver:
    """Tiny GPT, data parallel, checkpoints every ``every_n_steps`` in a directory of
    its own per node (or per rank)."""
    config = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        decay_steps=20,
        accelerator="cpu",
    )
    variable = {"node": "GROUP_RANK", "rank": "RANK"}[dir_per]
    node_dir = Path(run_dir) / f"{dir_per}{os.environ.get(variable, '0')}"
    return Driver(
        config.backend(),
        [Checkpoint(every_n_steps=every_n_steps, keep_last=2)],
        max_steps=max_steps,
        log_every=5,
        run_dir=node_dir,
    )
