"""GRPO runs of ``recipes/maxtext_tiny.py`` on the fixed rollouts of ``support.grpo``, with
MaxText's optimizer set to TRL's (AdamW, betas 0.9/0.999, eps 1e-8, no weight decay,
clipping at 1.0, a constant learning rate), in fp32 at the highest matmul precision.

    argv = grpo_argv(files, tmp_path / "run", loss_type="grpo", beta=0.04)
    driver, logged = run_grpo(argv, GatheredWeights())
    logged.metrics[1]["loss"], logged.metrics[1]["grad_norm"]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from baton.core import Callback
from support.grpo import grpo_flags
from support.posttrain import LoggedMetrics

RECIPE = Path(__file__).parents[2] / "recipes" / "maxtext_tiny.py"
#: the longest prompt of the fixed rollouts (tokens), and the rows' length: the longest
#: prompt and completion (support.grpo.MAX_COMPLETION) fit
MAX_PROMPT, SEQ_LEN = 24, 40
#: the learning rate of the runs compared with TRL
LR = 1e-3
#: MaxText's AdamW as TRL's (torch's AdamW with transformers' defaults, clipping at 1.0)
TRL_OPTIMIZER = (
    "adam_b1=0.9",
    "adam_b2=0.999",
    "adam_eps=1e-8",
    "adam_weight_decay=0",
    "gradient_clipping_threshold=1.0",
)
#: the exactness MaxText's numbers need to equal transformers'
FP32 = ("dtype=float32", "matmul_precision=highest")


def constant_lr(lr: float) -> list[str]:
    """The recipe's flags for a constant learning rate ``lr`` from the first step."""
    return ["--lr", str(lr), "--min-lr", str(lr), "--warmup-steps", "0"]


def grpo_argv(
    files: dict[str, Path],
    run_dir: Path,
    *,
    steps: int = 1,
    batch_size: int = 16,
    extra: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
    **settings: Any,
) -> list[str]:
    """The recipe's command line of a GRPO run on the fixed rollouts (every rollout in
    the first step's global batch: 16 rows), ``settings`` by TRL's names."""
    return [
        *grpo_flags(files, max_prompt_length=MAX_PROMPT, **settings),
        "--batch-size", str(batch_size), "--seq-len", str(SEQ_LEN), *constant_lr(LR),
        "--max-steps", str(steps), "--log-every", "1", "--run-dir", str(run_dir),
        "--no-progress", *extra, "--overrides", *FP32, *TRL_OPTIMIZER, *overrides,
    ]  # fmt: skip


class GatheredWeights(Callback):
    """What the backend's ``gather_weights()`` gives after each step (on the host; every
    process calls it, the first keeps what it gave)."""

    def __init__(self) -> None:
        self.values: dict[int, dict[str, np.ndarray]] = {}

    def on_step_end(self, driver: Any, output: Any) -> None:
        gathered = driver.backend.gather_weights()
        assert (gathered is not None) == (driver.backend.rank == 0)
        if gathered is not None:
            self.values[driver.step] = {name: np.array(v) for name, v in gathered.items()}


def run_grpo(argv: list[str], *callbacks: Callback) -> tuple[Any, LoggedMetrics]:
    """Build the recipe's driver from ``argv``, add ``callbacks`` and a metrics recorder,
    fit it; the driver and the logged metrics by step."""
    from baton.core.cli.recipe import build_driver

    logged = LoggedMetrics()
    driver = build_driver(RECIPE, argv)
    assert driver is not None
    driver.callbacks.extend([*callbacks, logged])
    driver.fit()
    return driver, logged
