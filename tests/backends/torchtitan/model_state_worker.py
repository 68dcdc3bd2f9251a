"""Run under torchrun with 2 processes: ``ModelStateProbe`` on TorchTitan from a
Hugging Face directory (``--init-from``), under FSDP 2, TP 2 and PP 2. Each rank writes
``<layout>_rank<r>.json`` into OUT.

model_state_worker.py HF_DIR OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from baton.core.cli.recipe import build_driver  # noqa: E402
from support.model_state_probe import FROZEN, ModelStateProbe  # noqa: E402

RECIPE = ROOT / "recipes" / "torchtitan_llama3_debug.py"
LAYOUTS = {
    "fsdp": ["--dp-shard", "2"],
    "tp": ["--dp-shard", "1", "--tp", "2"],
    "pp": ["--dp-shard", "1", "--pp", "2"],
}


def run(layout: str, source: str, out: Path) -> None:
    driver = build_driver(RECIPE, [
        "--init-from", source, "--max-steps", "4", "--seq-len", "64", "--batch-size", "2",
        "--log-every", "1", "--save-every", "0", "--run-dir", str(out / layout),
        "--no-progress", *LAYOUTS[layout],
    ])  # fmt: skip
    driver.backend.config.training.max_norm = 0.01
    probe = ModelStateProbe(FROZEN)
    driver.callbacks.append(probe)
    driver.fit()
    facts = {key: getattr(probe, key) for key in ("grad_norms", "lr_set", "lr_logged",
             "frozen_names", "frozen_unchanged", "trained_again")}  # fmt: skip
    facts["watched_while_frozen"] = sorted(probe.watched_while_frozen)
    facts["layouts"] = {
        p.name: [[s.start, s.stop] for s in p.index] for p in probe.state.parameters()
    }
    (out / f"{layout}_rank{driver.backend.rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    for name in LAYOUTS:
        run(name, sys.argv[1], Path(sys.argv[2]))
