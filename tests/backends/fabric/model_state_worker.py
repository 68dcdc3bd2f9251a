"""Run under torchrun with 2 processes: ``ModelStateProbe`` on Fabric (``ddp`` or ``fsdp``)
with the transformers Llama of ``recipes/hf_finetune.py``. Each rank saves its first
batch (``batch<r>.pt``) and what the probe saw (``rank<r>.json``) into OUT.

model_state_worker.py STRATEGY HF_DIR OUT
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

from support.model_state_probe import ModelStateProbe  # noqa: E402


def main(strategy: str, source: str, out: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "hf_finetune", ROOT / "recipes" / "hf_finetune.py"
    )
    assert spec is not None and spec.loader is not None
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    driver = hf.recipe(
        init_from=source, max_steps=4, log_every=1, eval_every=0, save_every=0,
        grad_clip=0.01, strategy=strategy, run_dir=str(out / "run"),
    )  # fmt: skip
    backend = driver.backend
    batches: list[dict[str, torch.Tensor]] = []

    def loss(model, batch):
        if not batches:
            batches.append({k: v.detach().cpu().clone() for k, v in batch.items()})
        return model(**batch).loss

    backend.loss_fn = loss
    probe = ModelStateProbe(["model.embed_tokens.*", "model.layers.0.*"])
    driver.callbacks.append(probe)
    driver.fit()
    rank = backend.rank
    torch.save(batches[0], out / f"batch{rank}.pt")
    facts = {
        key: getattr(probe, key)
        for key in (
            "grad_norms",
            "lr_set",
            "lr_logged",
            "frozen_names",
            "frozen_unchanged",
            "trained_again",
        )
    }
    facts["watched_while_frozen"] = sorted(probe.watched_while_frozen)
    (out / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
