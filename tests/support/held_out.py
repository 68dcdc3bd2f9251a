"""Post-training runs with held-out rows, as a user starts them, and what they logged.

    files = held_out_files(tmp_path)            # posttrain_files + other prepared data
    run = run_recipe(RECIPE, [...flags...], tmp_path / "run")
    run.train[1]["loss"], run.eval[1]["eval/loss"]

A run at ``--lr 1e-12`` keeps (to 1e-12) its starting weights, so its evaluation after step 1 is the
starting model's, which ``transformers`` (SFT) and TRL's ``DPOTrainer`` (DPO) compute
on the same rows (``support.posttrain``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.posttrain import (
    _documents,
    _load_model,
    posttrain_files,
    preference_prefix,
    sft_prefix,
)

ROOT = Path(__file__).resolve().parents[2]
ENV = {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}
#: rows of the training data; ``--eval-split 0.25`` holds the last two out
ROWS, HELD = 8, [6, 7]
#: the example objective a package declares (``--objective FOCAL_OBJECTIVE``)
FOCAL_OBJECTIVE = f"{ROOT / 'examples' / 'objectives' / 'focal.py'}:FOCAL"


@dataclass
class Logged:
    """A finished run's exit status, output and logged metrics by step and phase."""

    returncode: int
    output: str
    train: dict[int, dict[str, Any]] = field(default_factory=dict)
    eval: dict[int, dict[str, Any]] = field(default_factory=dict)


def held_out_files(root: Path, seq_len: int, family: str = "llama") -> dict[str, Path]:
    """``posttrain_files`` (``ROWS`` rows each) plus ``sft_eval`` and ``pairs_eval``: other
    prepared data of each kind (3 rows) for ``--eval-data-path``."""
    files = posttrain_files(root, seq_len, num_rows=ROWS, family=family)
    files["sft_eval"] = sft_prefix(root / "eval", files["tokenizer"], seq_len, num_rows=3)
    files["pairs_eval"] = preference_prefix(root / "eval", files["tokenizer"], seq_len, num_rows=3)
    return files


def run_recipe(
    recipe: Path, args: Sequence[str], run_dir: Path, timeout: int = 900, ranks: int = 1
) -> Logged:
    """``baton run RECIPE ARGS --run-dir RUN_DIR`` in a fresh process (under ``torchrun``
    with ``ranks`` gloo ranks when more than one); what it logged."""
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    done = subprocess.run(
        [*launch, "-m", "baton.core.cli.command", "run", str(recipe), *args,
         "--run-dir", str(run_dir), "--no-progress"],
        capture_output=True, text=True, timeout=timeout, env=os.environ | ENV, cwd=ROOT,
    )  # fmt: skip
    logged = Logged(done.returncode, done.stdout[-4000:] + done.stderr[-4000:])
    path = run_dir / "logs" / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        record = json.loads(line)  # each phase apart (read_jsonl merges a step's records)
        (logged.eval if record.get("phase") == "eval" else logged.train)[record["step"]] = record
    return logged


def focal_evaluation(model_dir: Path, prefix: Path, rows: Sequence[int], gamma: float) -> dict:
    """``transformers`` on each document of ``rows`` alone, unpacked, no gradient: the
    focal loss ``-(1 - p) ** gamma * log p`` summed over every supervised target and
    divided by their count, and the mean ``p`` of those targets (``focal/p``)."""
    import torch

    model = _load_model(model_dir).eval()
    loss, p_sum, count = 0.0, 0.0, 0
    with torch.no_grad():
        for tokens, mask in _documents(prefix, rows):
            ids = torch.tensor([tokens])
            logits = model(input_ids=ids).logits[0, :-1].double()
            logps = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
            supervised = torch.tensor(mask[1:], dtype=torch.float64)
            p = logps.exp()
            loss += float(-(((1 - p) ** gamma) * logps * supervised).sum())
            p_sum += float((p * supervised).sum())
            count += int(supervised.sum())
    return {"loss": loss / count, "focal/p": p_sum / count}
