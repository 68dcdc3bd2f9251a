"""A rank of a TorchTitan GRPO run under torchrun (``test_torchtitan_grpo_ranks``): the
debug recipe with the arguments given; each rank writes every log step's metrics to
``OUT/rank<r>.json``, and once training ends every rank gathers the policy's weights
(``gather_weights``, a collective): rank 0 writes them to ``OUT/gathered.safetensors``,
each rank records whether it got any.

    torchrun --nproc-per-node 2 grpo_worker.py OUT --objective grpo --dp-shard 2 ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from baton.core import Callback
from baton.core.cli.recipe import build_driver

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # support.grpo for the reward

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"


class Logged(Callback):
    """Every log step's metrics, and the weights gathered at the end of training."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.metrics: dict[int, dict[str, float]] = {}
        self.gathered: bool | None = None

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.metrics[driver.step] = dict(metrics)

    def on_train_end(self, driver: Any) -> None:
        weights = driver.backend.gather_weights()
        self.gathered = weights is not None
        if weights is not None:
            from safetensors.torch import save_file

            save_file(
                {k: v.contiguous() for k, v in weights.items()}, self.out / "gathered.safetensors"
            )


def main(out: Path, argv: list[str]) -> None:
    logged = Logged(out)
    driver = build_driver(RECIPE, argv)
    assert driver is not None
    driver.callbacks.append(logged)
    driver.fit()
    record = {"metrics": logged.metrics, "gathered": logged.gathered}
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
