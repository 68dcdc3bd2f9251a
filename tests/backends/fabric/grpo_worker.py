"""Run under torchrun (or alone): a GRPO run of ``recipes/hf_finetune.py`` whose ranks
record what the tests compare.

python grpo_worker.py OUT RECIPE_ARGS...

Each rank writes ``OUT.rank<r>.json``: every logged ``(step, metrics)`` and what
``backend.gather_weights()`` answered after the last step (``None`` on every rank but
the first); the first rank also writes those weights to ``OUT.gathered.safetensors``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from baton.core import Callback  # noqa: E402
from baton.core.cli.recipe import build_driver  # noqa: E402
from support.posttrain import LoggedMetrics  # noqa: E402


class GatherAtEnd(Callback):
    """``backend.gather_weights()`` after the run's last step (every rank calls it)."""

    def __init__(self) -> None:
        self.weights = None

    def on_train_end(self, driver) -> None:
        self.weights = driver.backend.gather_weights()


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    driver = build_driver(ROOT / "recipes" / "hf_finetune.py", args)
    assert driver is not None
    logged, gathered = LoggedMetrics(), GatherAtEnd()
    driver.callbacks += [logged, gathered]
    driver.fit()
    rank = driver.backend.rank
    if gathered.weights is not None:
        from safetensors.torch import save_file

        weights = {k: v.detach().cpu().contiguous() for k, v in gathered.weights.items()}
        save_file(weights, f"{out}.gathered.safetensors")
    result = {"logged": logged.logged, "gathered": gathered.weights is not None}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
