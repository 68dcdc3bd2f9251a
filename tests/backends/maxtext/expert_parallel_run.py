"""A tiny Qwen3-MoE on a mesh of 2 simulated CPU devices split by experts (expert
parallelism 2), with a capacity factor that drops tokens, in a fresh process; results
as JSON.

    python expert_parallel_run.py OUT.json WORKDIR HF_DIR

1. baton runs ``recipes/maxtext_tiny.py --init-from`` it with ``--devices 2 --ep 2
   --dp-shard 1 --overrides capacity_factor=0.5`` for 3 steps (fp32), saving at step 2;
2. MaxText's own ``train_loop`` runs the same config on the same mesh and batches;
3. the step-2 checkpoint is restored onto fsdp 2 (no expert parallelism: orbax
   reshards) and trains step 3.

The device count is fixed when JAX starts, hence a process of its own (the recipe
converts the Hugging Face weights in a child process, leaving this one's JAX unstarted).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # maxtext_support, mesh_run
RECIPE = HERE.parents[2] / "recipes" / "maxtext_tiny.py"
STEPS = 3


def main(out: str, work_dir: str, hf_dir: str) -> None:
    from mesh_run import restored, train_loop_losses

    from baton.core import Callback
    from baton.core.cli.recipe import build_driver

    work = Path(work_dir)
    logged: dict[int, dict[str, float]] = {}

    class Record(Callback):
        def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
            logged[driver.step] = dict(metrics)

    argv = [
        f"--init-from={hf_dir}", "--devices=2", "--ep=2", "--dp-shard=1",
        "--batch-size=2", f"--max-steps={STEPS}", "--log-every=1", "--eval-every=0",
        "--save-every=2", "--no-async-save", "--no-progress", "--no-print-loss",
        f"--run-dir={work / 'baton'}", "--overrides", "dtype=float32",
        "capacity_factor=0.5",
    ]  # fmt: skip
    driver = build_driver(RECIPE, argv)
    driver.callbacks.append(Record())
    checkpoint = driver.fit().checkpoints[0]
    layout = driver.backend.layout()
    reference = train_loop_losses(driver.backend.config, work)
    fsdp = restored(
        driver.backend.config, checkpoint, work,
        {"ici_expert_parallelism": 1, "ici_fsdp_parallelism": 2},
    )  # fmt: skip
    continued = fsdp.fetch({"3": fsdp.train_step(3).loss})
    report = {
        "checkpoint": checkpoint.name,
        "continued_layout": fsdp.layout(),
        "continued": continued,
        "layout": layout,
        "losses": {step: values["loss"] for step, values in logged.items()},
        "metrics": logged,
        "reference": reference,
    }
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
