"""The weights of a Fabric GRPO run: ``backend.gather_weights()`` (what the rollout
phase's generator loads, by Hugging Face name, in memory) equals the safetensors ``baton
export --format hf`` writes of the same checkpoint, on one rank and on the first of two
DDP ranks (``None`` on the other); ``transformers`` loads the export with the trained
weights. A Qwen3-MoE policy's gathered weights are ``transformers``' own layout (experts
fused, as the generator's model holds them), which the export writes one tensor per
expert: the same values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from baton.core import Callback
from baton.core.cli.recipe import build_driver
from support.grpo import learning_flags

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
RECIPE = ROOT / "recipes" / "hf_finetune.py"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


class GatherAtEnd(Callback):
    """``backend.gather_weights()`` after the last step, copied."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_end(self, driver) -> None:
        gathered = driver.backend.gather_weights()
        assert gathered is not None
        self.weights = {name: tensor.clone() for name, tensor in gathered.items()}


def flags(files: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    """Two steps of the learning task (sampled by the transformers generator), saved."""
    return [
        *learning_flags(files, max_prompt_length=24), "--max-steps", "2",
        "--batch-size", "16", "--lr", "5e-3", "--seq-len", "32", "--log-every", "1",
        "--save-every", "2", "--run-dir", str(run_dir), "--no-progress", *extra,
    ]  # fmt: skip


def export(checkpoint: Path, out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from baton.tools.export import main as export_main

    assert export_main([str(checkpoint), str(out), "--format", "hf"]) == 0
    return load_file(str(out / "model.safetensors"))


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_gathered_weights_equal_the_export_and_load_in_transformers(grpo_assets, tmp_path):
    from transformers import AutoModelForCausalLM

    files = grpo_assets["files"]
    gathered = GatherAtEnd()
    driver = build_driver(RECIPE, flags(files, tmp_path / "run"))
    assert driver is not None
    driver.callbacks.append(gathered)
    driver.fit()
    exported = export(tmp_path / "run" / "checkpoints" / "step_000002", tmp_path / "hf")
    assert_same(gathered.weights, exported)

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    start = AutoModelForCausalLM.from_pretrained(files["policy"], dtype=torch.float32)
    state, before = trained.state_dict(), start.state_dict()
    for name, tensor in gathered.weights.items():
        assert torch.equal(state[name], tensor), name
    assert all(not torch.equal(state[n], before[n]) for n in gathered.weights)  # trained


def test_a_moe_policy_trains_and_its_gathered_experts_are_the_export(grpo_assets, tmp_path):
    """A Qwen3-MoE policy: the generator loads the gathered (fused) experts each step;
    in ``save_pretrained``'s layout they are the export's tensors."""
    from baton.backends.fabric.export import saved_layout
    from support.posttrain import tiny_model

    files = {**grpo_assets["files"], "policy": tiny_model(tmp_path / "moe", family="qwen3_moe")}
    gathered = GatherAtEnd()
    driver = build_driver(RECIPE, flags(files, tmp_path / "run"))
    assert driver is not None
    driver.callbacks.append(gathered)
    driver.fit()
    assert any("experts" in name and "gate_up" in name for name in gathered.weights)
    exported = export(tmp_path / "run" / "checkpoints" / "step_000002", tmp_path / "hf")
    model = driver.backend.raw_model
    assert_same(saved_layout(model, gathered.weights), exported)


@pytest.mark.slow
def test_two_ddp_ranks_gather_the_export_on_the_first(grpo_assets, tmp_path, monkeypatch):
    """Under torchrun (2 ranks, gloo, ``--strategy ddp``) the first rank's gathered
    weights equal the export; the other rank gets ``None``."""
    from safetensors.torch import load_file

    from support.torchrun import torchrun

    files = grpo_assets["files"]
    run_dir, out = tmp_path / "run", tmp_path / "out"
    args = flags(files, run_dir, "--strategy", "ddp")
    args[args.index("--batch-size") + 1] = "8"  # 16 rollouts a step over the two ranks
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))  # the reward imports support.grpo
    torchrun(HERE / "grpo_worker.py", str(out), *args, nproc=2, timeout=600)
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
    assert [rank["gathered"] for rank in ranks] == [True, False]
    exported = export(run_dir / "checkpoints" / "step_000002", tmp_path / "hf")
    assert_same(load_file(f"{out}.gathered.safetensors"), exported)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp2", "fsdp1"])
def test_sharded_weights_are_gathered_whole_on_the_first_rank(tmp_path, mode):
    """A tiny Llama with tied embeddings sharded over 2 CPU ranks as Fabric's sharded
    strategies hold it (FSDP 2, FSDP 1 inside Fabric's module wrapper): the first rank
    gathers every weight whole, by the names the export writes (the tied ``lm_head``
    left out), equal to the unsharded model's; the other rank gets ``None``. (Fabric's
    own ``fsdp`` strategy needs GPUs.)"""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from support.tiny_llama import save_tiny_llama
    from support.torchrun import torchrun

    source = save_tiny_llama(tmp_path / "llama", tie=True)
    out = tmp_path / "out"
    torchrun(HERE / "gather_sharded_worker.py", mode, str(source), str(out), timeout=300)
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
    assert [rank["gathered"] for rank in ranks] == [True, False]
    whole = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).state_dict()
    expected = {name: tensor for name, tensor in whole.items() if name != "lm_head.weight"}
    assert_same(load_file(f"{out}.safetensors"), expected)
