"""The weights of a TorchTitan GRPO run: ``gather_weights`` (what the generator loads)
equals ``baton export``'s safetensors of the same weights, name for name and bit for
bit; a ``freeze`` callback keeps its parameters bit-identical while the rest trains (the
generator sampling from the gathered weights every step); the run's checkpoint exports
to Hugging Face and ``transformers`` loads the trained weights.

The run: ``learning_flags`` (the ``transformers`` generator, a vowel reward) for 3 steps
with layer 0 frozen by ``--callback freeze:...``, saved at step 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torchtitan")

import torch

from baton.core import Callback
from baton.core.cli.recipe import build_driver
from support.grpo import learning_flags
from support.posttrain import LoggedMetrics
from support.resilience import StepWeights, check_frozen

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
FROZEN = ["model.layers.0.*"]
STEPS = 3


class GatheredAtEnd(Callback):
    """``backend.gather_weights()`` once training ends (before teardown)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] | None = None

    def on_train_end(self, driver: Any) -> None:
        self.weights = driver.backend.gather_weights()


class Loads(Callback):
    """The weights' versions the generator held before each step's sampling."""

    def __init__(self) -> None:
        self.loads: list[int] = []

    def on_rollout_end(self, driver: Any, rollouts: Any) -> None:
        self.loads.append(driver.rollouts.generator.loads)


@pytest.fixture(scope="module")
def grpo_run(grpo_assets, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    files = grpo_assets["files"]
    run_dir = tmp_path_factory.mktemp("titan_grpo_weights") / "run"
    flags = [
        *learning_flags(files, max_prompt_length=24),
        "--max-steps", str(STEPS), "--batch-size", "16", "--lr", "5e-3", "--seq-len", "32",
        "--log-every", "1", "--save-every", str(STEPS), "--run-dir", str(run_dir),
        "--no-progress", "--callback", f"freeze:patterns=[{','.join(FROZEN)}]",
    ]  # fmt: skip
    weights, logged, gathered, loads = StepWeights(), LoggedMetrics(), GatheredAtEnd(), Loads()
    driver = build_driver(RECIPE, flags)
    assert driver is not None
    driver.callbacks += [weights, logged, gathered, loads]
    driver.fit()
    return {
        "run_dir": run_dir,
        "weights": weights,
        "metrics": logged,
        "gathered": gathered.weights,
        "loads": loads.loads,
        "policy": files["policy"],
    }


def test_freeze_keeps_layer_0_while_grpo_trains_the_rest(grpo_run):
    frozen = check_frozen(grpo_run["weights"], FROZEN)
    first = grpo_run["metrics"].metrics[1]
    assert first["freeze/frozen"] == len(frozen)
    assert grpo_run["loads"] == [1, 2, 3]  # the generator loaded the new weights each step


def test_gathered_weights_equal_the_export(grpo_run, tmp_path):
    """The weights gathered after step 3 are the export of step 3's checkpoint: the same
    Hugging Face names and shapes, bit for bit (and the model_state weights of the run)."""
    from safetensors.torch import load_file

    from baton.tools.export import main as export_main

    checkpoint = grpo_run["run_dir"] / "checkpoints" / f"step_{STEPS:06d}"
    assert export_main([str(checkpoint), str(tmp_path / "hf"), "--format", "hf"]) == 0
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    gathered = grpo_run["gathered"]
    assert gathered is not None and set(gathered) == set(exported)
    for name, value in exported.items():
        assert gathered[name].shape == value.shape and torch.equal(gathered[name], value), name
    last = grpo_run["weights"].values[STEPS]
    for name, value in last.items():
        assert np.array_equal(gathered[name].numpy().reshape(value.shape), value), name


def test_the_grpo_export_loads_in_transformers_with_the_trained_weights(grpo_run, tmp_path):
    """``baton export --format hf`` of the GRPO checkpoint: ``transformers`` loads it and
    holds the weights training ended with (not the starting ones), and its logits equal
    TorchTitan's model holding the checkpoint's weights."""
    from baton.backends.torchtitan.export import dcp_folder, read_model_weights
    from baton.backends.torchtitan.hf import model_config
    from baton.core.model.spec import LlamaSpec
    from baton.tools.export import main as export_main
    from support.tiny_llama import load_llama
    from support.titan_model import sdpa_model

    checkpoint = grpo_run["run_dir"] / "checkpoints" / f"step_{STEPS:06d}"
    assert export_main([str(checkpoint), str(tmp_path / "hf"), "--format", "hf"]) == 0
    exported = load_llama(tmp_path / "hf")
    start = load_llama(grpo_run["policy"]).state_dict()
    loaded = exported.state_dict()
    last = grpo_run["weights"].values[STEPS]
    for name, value in last.items():
        assert np.array_equal(loaded[name].numpy().reshape(value.shape), value), name
    moved = [n for n in last if not torch.equal(loaded[n], start[n])]
    assert moved and not any(n.startswith("model.layers.0.") for n in moved)
    tokens = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(0))
    trained = read_model_weights(dcp_folder(checkpoint))
    with torch.no_grad():
        expected = sdpa_model(model_config(LlamaSpec.from_hf(grpo_run["policy"])), trained)(tokens)
        got = exported(tokens).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
