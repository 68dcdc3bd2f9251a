"""SFT and DPO first steps on 2 simulated CPU devices (FSDP 2) with MaxText's gradient
accumulation over 2 micro-batches, in a fresh process; the first step's metrics as JSON.

    python posttrain_mesh_run.py OUT.json WORKDIR TOKENIZER SFT_MODEL SFT_PREFIX \
        POLICY REFERENCE PAIRS_PREFIX ROWS SEQ

The global batch is every one of ``ROWS`` rows: 2 devices x 2 micro-batches x ROWS / 4.
The device count is fixed when JAX starts, hence a process of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "maxtext_tiny.py"


def first_step(run_dir: Path, rows: int, seq: int, *flags: str) -> dict[str, float]:
    from baton.core import Callback
    from baton.core.cli.recipe import build_driver

    logged: dict[int, dict[str, float]] = {}

    class Record(Callback):
        def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
            logged[driver.step] = dict(metrics)

    driver = build_driver(RECIPE, [
        "--devices", "2", "--dp-shard", "2", "--batch-size", str(rows // 4),
        "--max-steps", "1", "--log-every", "1", "--save-every", "0",
        "--no-callback", "checkpoint", "--seq-len", str(seq), "--run-dir", str(run_dir),
        "--no-progress", *flags, "--overrides", "dtype=float32", "matmul_precision=highest",
        "gradient_accumulation_steps=2",
    ])  # fmt: skip
    driver.callbacks.append(Record())
    driver.fit()
    layout = driver.backend.layout()
    return {**logged[1], "devices": layout["devices"], "fsdp": layout["mesh"].get("fsdp", 1)}


def main(argv: list[str]) -> None:
    out, work, tokenizer, sft_model, sft_prefix, policy, reference, pairs = argv[:8]
    rows, seq = int(argv[8]), int(argv[9])
    common = ("--tokenizer", tokenizer)
    report = {
        "sft": first_step(
            Path(work) / "sft", rows, seq, *common, "--objective", "sft",
            "--init-from", sft_model, "--data-path", sft_prefix,
        ),
        "dpo": first_step(
            Path(work) / "dpo", rows, seq, *common, "--objective", "dpo",
            "--init-from", policy, "--reference", reference, "--dpo-beta", "0.2",
            "--data-path", pairs,
        ),
    }  # fmt: skip
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
