"""MaxText's ``model_state`` on a mesh of 4 simulated CPU devices (fsdp 2 x tensor 2):
the gradients before clipping, sharded over the mesh, have the per-parameter norms of
``transformers``' autograd from the same Hugging Face weights and batch, and a layer
frozen on the sharded state stays bitwise. ``model_state_mesh_run.py`` runs in a fresh
process (the device count is fixed when JAX starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from support.tiny_llama import load_llama, save_tiny_llama

pytest.importorskip("maxtext")
pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def mesh_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("model_state_mesh")
    hf_dir = save_tiny_llama(work / "hf", vocab_size=512, initializer_range=0.3)
    out = work / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env |= {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}
    # --init-from converts the weights with JAX before the recipe's --devices patch runs
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    done = subprocess.run(
        [sys.executable, str(HERE / "model_state_mesh_run.py"), str(out), str(hf_dir),
         str(work / "run")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text()) | {"hf_dir": hf_dir}


def test_sharded_gradient_norms_equal_transformers(mesh_report):
    from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus

    assert mesh_report["mesh"]["fsdp"] == 2 and mesh_report["mesh"]["tensor"] == 2
    assert "fsdp" in mesh_report["sharding"] or "tensor" in mesh_report["sharding"]
    stream = TextBatches(TextCorpus.load(None).train, batch_size=mesh_report["batch_size"],
                         seq_len=64, seed=0)  # fmt: skip
    batch = next(stream)
    model = load_llama(mesh_report["hf_dir"])
    tokens, targets = (torch.from_numpy(batch[k]).long() for k in ("inputs", "targets"))
    logits = model(tokens).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    norms = mesh_report["norms"]
    for name, parameter in model.named_parameters():
        assert norms[name] == pytest.approx(float(parameter.grad.norm()), rel=1e-4), name


def test_a_layer_frozen_on_the_sharded_state_stays_bitwise(mesh_report):
    assert mesh_report["frozen_unchanged"] is True
    assert not any(n.startswith("model.layers.0.") for n in mesh_report["shown_at_step_2"])
