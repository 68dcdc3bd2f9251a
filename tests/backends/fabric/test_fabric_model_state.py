"""The ``model_state`` ability on Fabric with a transformers Llama (``recipes/hf_finetune.py``):
gradient norms before clipping against transformers' own, freezing, a learning rate
set by a callback; in one process, and under DDP 2 (``model_state_worker.py``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from baton.core.cli.recipe import build_driver
from support.model_state_probe import FROZEN, ModelStateProbe, check_probe, transformers_grad_norms
from support.torchrun import torchrun

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
RECIPE = ROOT / "recipes" / "hf_finetune.py"


def hf_recipe():
    spec = importlib.util.spec_from_file_location("hf_finetune_recipe", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_process_gradients_freeze_and_lr(tmp_path: Path):
    hf = hf_recipe()
    source = hf.save_tiny_llama(tmp_path / "tiny-llama")
    args = ["--init-from", str(source), "--max-steps", "4", "--log-every", "1"]
    args += ["--eval-every", "0", "--save-every", "0", "--run-dir", str(tmp_path / "run")]
    args += ["--grad-clip", "0.01"]  # clipping bites: the norms shown are from before it
    driver = build_driver(RECIPE, args)
    probe = ModelStateProbe(FROZEN)
    driver.callbacks.append(probe)
    driver.fit()
    first = next(iter(hf.byte_lm_data(seq_len=64, batch_size=8, seed=0, path=None)[0]))
    check_probe(probe, transformers_grad_norms(source, [first]))
    assert sum(v**2 for v in probe.grad_norms.values()) ** 0.5 > 0.1  # well above the clip


def test_ddp_gradients_freeze_and_lr(tmp_path: Path):
    """Rank 1 holds only uncounted replicas: it still takes part in every sum.
    (Fabric's ``fsdp`` strategy needs a GPU: FSDP layouts are covered on CPU by
    ``tests/backends/test_torch_model_state.py``.)"""
    hf = hf_recipe()
    source = hf.save_tiny_llama(tmp_path / "tiny-llama")
    torchrun(HERE / "model_state_worker.py", "ddp", str(source), str(tmp_path))
    import torch

    batches = [torch.load(tmp_path / f"batch{r}.pt") for r in range(2)]
    expected = transformers_grad_norms(source, batches)
    for rank in range(2):
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        probe = ModelStateProbe(FROZEN)
        probe.__dict__.update(facts)
        probe.lr_logged = {int(k): v for k, v in facts["lr_logged"].items()}
        probe.watched_while_frozen = set(facts["watched_while_frozen"])
        check_probe(probe, expected)
