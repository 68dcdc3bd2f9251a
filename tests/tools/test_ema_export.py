"""``baton export --ema``: averaged weights saved as pieces by several ranks are
assembled into whole tensors and exported in Hugging Face format that transformers
loads; a checkpoint without averages is refused clearly."""

from __future__ import annotations

from pathlib import Path

import torch

from baton.core.checkpoints.array_files import array_file, layout_metadata
from baton.core.cli.command import main as baton
from baton.core.cli.recipe import build_driver
from baton.core.model_state import Piece

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "hf_finetune.py"


def save_as_two_ranks(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Each tensor's first rows in rank 0's file, the rest in rank 1's (a row split)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    for rank in (0, 1):
        pieces, arrays = [], {}
        for name, tensor in tensors.items():
            half = (tensor.shape[0] + 1) // 2
            rows = slice(0, half) if rank == 0 else slice(half, tensor.shape[0])
            index = (rows, *(slice(0, n) for n in tensor.shape[1:]))
            pieces.append(Piece(name, tensor[index], tuple(tensor.shape), index))
            arrays[name] = tensor[index].contiguous()
        save_file(arrays, str(directory / array_file(rank)), metadata=layout_metadata(pieces))


def test_export_ema_assembles_every_rank_s_pieces_into_a_transformers_model(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    source = tmp_path / "tiny-llama"
    args = ["--init-from", str(_tiny(source)), "--max-steps", "1", "--save-every", "1"]
    build_driver(RECIPE, [*args, "--run-dir", str(tmp_path / "run")]).fit()
    checkpoint = tmp_path / "run/checkpoints/step_000001"
    assert baton(["export", str(checkpoint), "--format", "hf", str(tmp_path / "no"), "--ema"]) == 2
    assert "no averaged weights" in capsys.readouterr().err

    trained = AutoModelForCausalLM.from_pretrained(source).state_dict()
    torch.manual_seed(1)
    averages = {name: torch.randn_like(value) for name, value in trained.items()}
    save_as_two_ranks(checkpoint / "ema", averages)
    out = tmp_path / "exported"
    assert baton(["export", str(checkpoint), "--format", "hf", str(out), "--ema"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert exported.keys() == averages.keys()
    for name, value in averages.items():
        assert torch.equal(exported[name], value), name


def _tiny(directory: Path) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_finetune_recipe", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.save_tiny_llama(directory)


def test_fabric_ema_resumes_bitwise_and_exports_what_transformers_loads(tmp_path):
    """EMA on Fabric (a transformers Llama, Hugging Face names): a run resumed from step 2
    ends with the same averages bit for bit, and ``--ema`` exports them."""
    from transformers import AutoModelForCausalLM

    from baton.callbacks import EMA

    source = _tiny(tmp_path / "tiny-llama")

    def run(name, *extra):
        args = ["--init-from", str(source), "--max-steps", "3", "--save-every", "1"]
        driver = build_driver(RECIPE, [*args, "--run-dir", str(tmp_path / name), *extra])
        ema = EMA(decay=0.5)
        driver.callbacks.append(ema)
        driver.fit()
        return {name: value.clone() for name, value in ema.averages.items()}

    whole = run("whole")
    resumed = run("resumed", "--resume", str(tmp_path / "whole/checkpoints/step_000002"))
    assert whole.keys() == resumed.keys() and whole
    for name, value in whole.items():
        assert torch.equal(resumed[name], value), name
    out = tmp_path / "exported"
    checkpoint = tmp_path / "whole/checkpoints/step_000003"
    assert baton(["export", str(checkpoint), "--format", "hf", str(out), "--ema"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert exported.keys() == whole.keys()
    for name, value in whole.items():
        assert torch.equal(exported[name], value), name


def test_megatron_ema_of_fused_tensors_exports_in_hugging_face_names(tmp_path):
    """EMA on Megatron-Core: q/k/v and gate/up averaged as views into the fused tensors,
    saved with the checkpoint, exported by ``--ema`` under their Hugging Face names."""
    import pytest

    pytest.importorskip("megatron.core")
    from transformers import AutoModelForCausalLM

    from baton.callbacks import EMA
    from support.tiny_llama import save_tiny_llama

    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=512)
    args = [
        "--init-from", str(hf_dir), "--max-steps", "2", "--save-every", "2", "--lr", "3e-3",
        "--no-async-save", "--eval-every", "0", "--batch-size", "2",
        "--global-batch-size", "2", "--run-dir", str(tmp_path / "run"), "--no-progress",
    ]  # fmt: skip
    driver = build_driver(Path(RECIPE).with_name("megatron_gpt_tiny.py"), args)
    ema = EMA(decay=0.5)
    driver.callbacks.append(ema)
    driver.fit()
    averages = {name: value.detach().clone() for name, value in ema.averages.items()}
    assert "model.layers.0.self_attn.k_proj.weight" in averages
    out = tmp_path / "exported"
    checkpoint = tmp_path / "run/checkpoints/step_000002"
    assert baton(["export", str(checkpoint), "--format", "hf", str(out), "--ema"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert sorted(exported) == sorted(averages)
    for name, value in averages.items():  # q/k/v per key/value group, vocabulary padded
        shape = exported[name].shape
        value = value.reshape(shape) if value.numel() == exported[name].numel() else value
        assert torch.equal(exported[name], value[: shape[0]].float()), name
