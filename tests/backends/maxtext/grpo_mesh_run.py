"""A GRPO first step on the fixed rollouts over 2 simulated CPU devices (FSDP 2) with
MaxText's gradient accumulation over 2 micro-batches, in a fresh process: the step's
metrics, and the weights ``gather_weights()`` gave after it (``gathered.safetensors``), with a
checkpoint of the same weights (``RUN_DIR/checkpoints/step_000001``).

    python grpo_mesh_run.py OUT.json RUN_DIR FILES.json

``FILES.json`` holds ``support.grpo.grpo_files``' paths. The global batch is every one of
the 16 rollouts: 2 devices x 2 micro-batches x 4 rows. The device count is fixed when JAX
starts, hence a process of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests' support package


def main(out: str, run_dir: str, files_json: str) -> None:
    from safetensors.numpy import save_file

    from support.maxtext_grpo import GatheredWeights, grpo_argv, run_grpo

    files = {name: Path(path) for name, path in json.loads(Path(files_json).read_text()).items()}
    gathered = GatheredWeights()
    argv = grpo_argv(
        files,
        Path(run_dir),
        batch_size=4,
        extra=("--devices", "2", "--dp-shard", "2", "--save-every", "1", "--no-async-save"),
        overrides=("gradient_accumulation_steps=2",),
    )
    driver, logged = run_grpo(argv, gathered)
    layout = driver.backend.layout()
    save_file(gathered.values[1], str(Path(run_dir) / "gathered.safetensors"))
    report = {**logged.metrics[1], "devices": layout["devices"], "fsdp": layout["mesh"]["fsdp"]}
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
