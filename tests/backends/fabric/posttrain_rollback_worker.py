"""Run under torchrun with 2 processes: an SFT or DPO run of ``recipes/hf_finetune.py``
rolled back under DDP replays bitwise.

python posttrain_rollback_worker.py OUT MODE RECIPE_ARGS...

``MODE`` is ``straight`` (the run as given) or ``rollback`` (at the start of step 5 the
run goes back to its step-2 checkpoint and replays). Each rank writes every logged
``(step, metrics)`` and its final weights' hash to ``OUT.<mode>.rank<r>.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from baton.core.cli.recipe import build_driver  # noqa: E402
from support.resilience import LoggedMetrics, RollbackOnce  # noqa: E402


def main() -> None:
    out, mode, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    driver = build_driver(ROOT / "recipes" / "hf_finetune.py", args)
    assert driver is not None
    metrics = LoggedMetrics()
    driver.callbacks.append(metrics)
    if mode == "rollback":
        driver.callbacks.append(RollbackOnce(at_step=5, to_step=2))
    driver.fit()
    model = driver.backend.model_state().parameters()
    weights = torch.cat([p.value.detach().flatten() for p in model]).numpy().tobytes()
    result = {"logged": metrics.logged, "weights": hashlib.sha256(weights).hexdigest()}
    Path(f"{out}.{mode}.rank{driver.backend.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
