"""One callback file that touches the model (``support/attention_rms.py``, the README's
example) runs unchanged on every backend with the ``model_state`` ability: from the same
Hugging Face weights, each backend logs the same RMS of every attention output
projection. Every declared backend runs it (``baton.core.backend_descriptor``); each
has one entry in ``BACKENDS`` building it from those weights."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from baton.core import Callback, Driver
from baton.core.backend_descriptor import backend_descriptors
from support.attention_rms import AttentionOutputRMS
from support.tiny_llama import save_tiny_llama

ROOT = Path(__file__).resolve().parents[2]


def o_proj_weights(hf_dir: Path) -> list[np.ndarray]:
    """Each layer's ``self_attn.o_proj.weight`` from the Hugging Face files, in order."""
    from safetensors.numpy import load_file

    weights = load_file(str(hf_dir / "model.safetensors"))
    names = sorted((n for n in weights if n.endswith("self_attn.o_proj.weight")),
                   key=lambda n: int(re.search(r"layers\.(\d+)\.", n).group(1)))  # fmt: skip
    return [weights[name] for name in names]


def jax_backend(hf_dir: Path) -> Any:
    """Your own flax model with the Hugging Face o_proj weights (``kernel`` = weight.T)."""
    import optax

    from baton.backends.jax import JaxBackend
    from support.jax_llama import next_token_loss, tiny_llama_nnx, token_batches

    weights = o_proj_weights(hf_dir)
    layers, hidden = len(weights), weights[0].shape[0]
    return JaxBackend(
        model=lambda: tiny_llama_nnx(0, layers=layers, hidden=hidden, o_proj=weights),
        optimizer=optax.sgd(0.0),
        loss_fn=next_token_loss,
        train_data=token_batches(1),
    )


def fabric_backend(hf_dir: Path) -> Any:
    """``recipes/hf_finetune.py``: the transformers model on Fabric (lr > 0 required)."""
    from baton.core.cli.recipe import build_driver

    args = ["--init-from", str(hf_dir), "--lr", "1e-12", "--run-dir", str(hf_dir.parent / "fabric")]
    return build_driver(ROOT / "recipes" / "hf_finetune.py", args).backend


def lightning_backend(hf_dir: Path) -> Any:
    """A LightningModule holding the transformers model."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from baton.backends.fabric import FabricConfig
    from baton.backends.lightning import LightningBackend

    class LlamaModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            from transformers import AutoModelForCausalLM

            self.llama = AutoModelForCausalLM.from_pretrained(hf_dir)

        def training_step(self, batch, batch_idx):
            return self.llama(**batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def train_dataloader(self):
            tokens = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(5))
            return DataLoader([{"input_ids": t, "labels": t} for t in tokens], batch_size=4)

    return LightningBackend(LlamaModule(), config=FabricConfig(accelerator="cpu"))


def megatron_backend(hf_dir: Path) -> Any:
    """``recipes/megatron_gpt_tiny.py``: Megatron-Core's GPTModel."""
    pytest.importorskip("megatron.core")
    from baton.core.cli.recipe import build_driver

    args = [
        "--init-from", str(hf_dir), "--lr", "1e-12", "--warmup-steps", "2",
        "--save-every", "0", "--no-async-save", "--eval-every", "0", "--batch-size", "2",
        "--global-batch-size", "2", "--run-dir", str(hf_dir.parent / "megatron"), "--no-progress",
    ]  # fmt: skip
    return build_driver(ROOT / "recipes" / "megatron_gpt_tiny.py", args).backend


def torchtitan_backend(hf_dir: Path) -> Any:
    """``recipes/torchtitan_llama3_debug.py``: TorchTitan's Llama (fused QKV or not)."""
    pytest.importorskip("torchtitan")
    from baton.core.cli.recipe import build_driver

    args = [
        "--init-from", str(hf_dir), "--lr", "1e-12", "--seq-len", "16", "--batch-size", "2",
        "--save-every", "0", "--run-dir", str(hf_dir.parent / "torchtitan"), "--no-progress",
    ]  # fmt: skip
    return build_driver(ROOT / "recipes" / "torchtitan_llama3_debug.py", args).backend


def maxtext_backend(hf_dir: Path) -> Any:
    """``recipes/maxtext_tiny.py``: MaxText's layers scanned into stacked arrays."""
    pytest.importorskip("maxtext")
    from baton.core.cli.recipe import build_driver

    root = hf_dir.parent
    args = [
        "--init-from", str(hf_dir), "--lr", "1e-12", "--batch-size", "2",
        "--seq-len", "16", "--run-dir", str(root / "maxtext"),
        "--overrides", "dtype=float32", f"base_output_directory={root / 'maxtext-out'}",
    ]  # fmt: skip
    return build_driver(ROOT / "recipes" / "maxtext_tiny.py", args).backend


#: name -> build(hf_dir) of a backend whose model starts from those weights, lr 0 (or
#: small enough to leave them as they are to 1e-5)
BACKENDS: dict[str, Callable[[Path], Any]] = {
    "fabric": fabric_backend,
    "jax": jax_backend,
    "lightning": lightning_backend,
    "maxtext": maxtext_backend,
    "megatron": megatron_backend,
    "torchtitan": torchtitan_backend,
}


class Logged(Callback):
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def on_log(self, driver, metrics):
        self.metrics = dict(metrics)


@pytest.mark.parametrize("name", sorted(d.name for d in backend_descriptors()))
def test_one_callback_file_runs_on_every_backend(name, tmp_path):
    if name not in BACKENDS:
        pytest.fail(f"backend {name!r} is declared but this test cannot build it from "
                    f"Hugging Face weights: add it to BACKENDS in {Path(__file__).name}")  # fmt: skip
    hf_dir = save_tiny_llama(tmp_path / "hf")
    logged = Logged()
    Driver(BACKENDS[name](hf_dir), [AttentionOutputRMS(), logged], max_steps=1, log_every=1,
           run_dir=tmp_path / "run").fit()  # fmt: skip
    rms = {key: value for key, value in logged.metrics.items() if key.startswith("rms/")}
    expected = [float(np.sqrt(np.mean(w.astype(np.float64) ** 2))) for w in o_proj_weights(hf_dir)]
    assert len(rms) == len(expected) == 2
    by_layer = [rms[key] for key in sorted(rms, key=lambda k: int(re.search(r"\.(\d+)\.", k)[1]))]
    assert by_layer == pytest.approx(expected, rel=1e-5)


def test_the_docs_show_this_callback_file():
    from support.docs_examples import docs_example

    assert docs_example("model-callback") == (ROOT / "tests/support/attention_rms.py").read_text()
