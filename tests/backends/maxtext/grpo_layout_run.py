"""A GRPO first step on the fixed rollouts under a parallel layout, in a fresh process:
the step's metrics, and the weights ``gather_weights()`` gave after it on the first
process (``gathered.safetensors``), with a checkpoint of the same weights
(``RUN_DIR/checkpoints/step_000001``).

    python grpo_layout_run.py OUT.json RUN_DIR FILES.json fsdp
    BATON_RANK=r BATON_WORLD_SIZE=2 ... python grpo_layout_run.py OUT_{rank}.json RUN_DIR \
        FILES.json processes CHECKPOINT

``FILES.json`` holds ``support.grpo.grpo_files``' paths; ``{rank}`` in ``OUT.json`` becomes
the process's rank; ``CHECKPOINT`` (optional) starts the run from a checkpoint's weights
instead of the policy's Hugging Face directory. The global batch is every one of the 16 rollouts: ``fsdp``, 2
simulated CPU devices (FSDP 2) x 2 micro-batches (MaxText's gradient accumulation) x 4
rows; ``processes``, this process one of 2 JAX processes (one CPU device each, FSDP over
both) x 8 rows, the first sampling and broadcasting the rollouts. The device count is
fixed when JAX starts, hence a process of its own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests' support package

#: each layout's flags and MaxText overrides
LAYOUTS = {
    "fsdp": (
        ("--batch-size", "4", "--devices", "2", "--dp-shard", "2"),
        ("gradient_accumulation_steps=2",),
    ),
    "processes": (("--batch-size", "8"), ()),
}


def main(out: str, run_dir: str, files_json: str, layout: str, init_from: str = "") -> None:
    from safetensors.numpy import save_file

    from support.maxtext_grpo import GatheredWeights, grpo_argv, run_grpo

    files = {name: Path(path) for name, path in json.loads(Path(files_json).read_text()).items()}
    flags, overrides = LAYOUTS[layout]
    gathered = GatheredWeights()
    argv = grpo_argv(
        files,
        Path(run_dir),
        extra=(*flags, "--save-every", "1", "--no-async-save"),
        overrides=overrides,
    )
    if init_from:
        argv[argv.index("--init-from") + 1] = init_from
    driver, logged = run_grpo(argv, gathered)
    if gathered.values:
        save_file(gathered.values[1], str(Path(run_dir) / "gathered.safetensors"))
    shape = driver.backend.layout()
    report = {
        **logged.metrics[1],
        "devices": shape["devices"],
        "processes": shape["processes"],
        "fsdp": shape["mesh"].get("fsdp", 1),
        "gathered": sorted(gathered.values),
    }
    rank = os.environ.get("BATON_RANK", "0")
    Path(out.replace("{rank}", rank)).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
