"""Checkpoints that move: train on backend X from one Hugging Face Llama, export with
``baton export --format hf``, load the export on backend Y; Y's logits equal the exported
model's (``transformers``). X and Y range over TorchTitan, Megatron-Core and Fabric
(whose model is ``transformers``' own), and MaxText as a source (X = MaxText, scanned
layers, fp32; as a target its first loss is checked in tests/backends/maxtext)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("megatron.core")
pytest.importorskip("maxtext")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch

from baton.core.recipe import build_driver
from support.tiny_llama import load_llama, save_tiny_llama

RECIPES = Path(__file__).parents[2] / "recipes"
VOCAB = 512
TRAIN = {
    "torchtitan": ("torchtitan_llama3_debug.py", ["--seq-len", "64", "--batch-size", "2"]),
    "megatron": ("megatron_gpt_tiny.py", ["--no-async-save"]),
    "fabric": ("hf_finetune.py", ["--eval-every", "50"]),
    "maxtext": ("maxtext_tiny.py", [
        "--per-device-batch-size", "2", "--eval-every", "0", "--no-async-save",
        "--no-progress", "--overrides", "dtype=float32",
    ]),
}  # fmt: skip


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))


def titan_logits(hf_dir: Path) -> torch.Tensor:
    """TorchTitan's model for the directory's spec, weights through TorchTitan's own
    ``Llama3StateDictAdapter.from_hf`` (SDPA attention, as on CPU)."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

    from baton.backends.megatron.hf import read_hf_weights
    from baton.backends.torchtitan.hf import model_config
    from baton.core.model_spec import LlamaSpec

    config = model_config(LlamaSpec.from_hf(hf_dir))
    for _fqn, _cfg, parent, attr in list(config.traverse(FlexAttention.Config)):
        if parent is not None:
            setattr(parent, attr, ScaledDotProductAttention.Config())
    model = config.build()
    weights = Llama3StateDictAdapter(config, None).from_hf(read_hf_weights(str(hf_dir)))
    with torch.no_grad():
        model.init_weights(buffer_device=None)
        model.load_state_dict(weights)
        return model.eval()(_tokens())


def megatron_logits(hf_dir: Path, run_dir: Path) -> torch.Tensor:
    """Megatron-Core's GPTModel built by the recipe from ``--init-from hf_dir``."""
    from baton.backends.megatron import cpu
    from baton.core.patches import PatchRecorder

    argv = ["--init-from", str(hf_dir), "--run-dir", str(run_dir)]
    backend = build_driver(RECIPES / "megatron_gpt_tiny.py", argv).backend
    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    try:
        backend.setup()
        model = backend.chunks[0].module.eval()
        tokens = _tokens()
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        mask = torch.triu(torch.ones(32, 32, dtype=torch.bool), 1)[None, None]
        with torch.no_grad():
            return model(tokens, positions, mask)
    finally:
        backend.teardown()
        recorder.undo()


def fabric_logits(hf_dir: Path, _run_dir: Path | None = None) -> torch.Tensor:
    """Fabric's model is transformers' LlamaForCausalLM from the directory."""
    with torch.no_grad():
        return load_llama(hf_dir)(_tokens()).logits


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each backend trains 2 steps from the same HF Llama and exports its checkpoint."""
    from baton.tools.export import main as export_main

    root = tmp_path_factory.mktemp("round_trip")
    source = save_tiny_llama(root / "source", vocab_size=VOCAB)
    out: dict[str, Any] = {"root": root}
    for name, (recipe, extra) in TRAIN.items():
        run_dir = root / f"run-{name}"
        argv = ["--init-from", str(source), "--max-steps", "2", "--save-every", "2"]
        argv += ["--log-every", "1", "--run-dir", str(run_dir), *extra]
        build_driver(RECIPES / recipe, argv).fit()
        checkpoint = run_dir / "checkpoints" / "step_000002"
        assert export_main([str(checkpoint), str(root / name), "--format", "hf"]) == 0
        out[name] = root / name
    return out


@pytest.mark.parametrize("source", list(TRAIN))
@pytest.mark.parametrize("target", ["torchtitan", "megatron", "fabric"])
def test_x_to_hf_to_y_computes_the_same_function(exports, source, target, tmp_path):
    hf_dir = exports[source]
    expected = fabric_logits(hf_dir)
    if target == "torchtitan":
        got = titan_logits(hf_dir)
    elif target == "megatron":
        got = megatron_logits(hf_dir, tmp_path / "m")
    else:
        got = fabric_logits(hf_dir)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
