"""The ``model_state`` ability on TorchTitan from a Hugging Face directory: per-layer
gradient norms before clipping under Hugging Face names against transformers' own,
freezing and a learning rate set by a callback; in one process, and under FSDP 2,
TP 2 and PP 2 on gloo (``model_state_worker.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

import torch

from baton.core import Callback
from baton.core.cli.recipe import build_driver
from support.model_state_probe import (
    FROZEN,
    ModelStateProbe,
    check_probe,
    token_loss,
    transformers_grad_norms,
)
from support.tiny_llama import load_llama, save_tiny_llama
from support.titan_batches import first_byte_batch
from support.torchrun import torchrun

HERE = Path(__file__).parent
RECIPE = HERE.parents[2] / "recipes" / "torchtitan_llama3_debug.py"
SEQ, BATCH = 64, 2

pytestmark = pytest.mark.slow


class HfValues(Callback):
    """At the last step: every piece reshaped to its Hugging Face shape, against
    TorchTitan's own adapter's ``to_hf`` of the model's state dict."""

    def on_step_end(self, driver, output) -> None:
        if driver.step != driver.options.max_steps:
            return
        trainer = driver.backend.trainer
        adapter = trainer.checkpointer.sd_adapter
        state = trainer.model_parts[0].state_dict()
        hf = adapter.to_hf({k: getattr(v, "full_tensor", v.detach)() for k, v in state.items()})
        pieces = driver.backend.model_state().parameters()
        self.equal = {
            p.name: torch.equal(p.value.reshape(hf[p.name].shape), hf[p.name]) for p in pieces
        }


def test_one_process_hf_names_gradients_freeze_and_lr(tmp_path: Path):
    source = save_tiny_llama(tmp_path / "hf")
    driver = build_driver(RECIPE, [
        "--init-from", str(source), "--max-steps", "4", "--seq-len", str(SEQ),
        "--batch-size", str(BATCH), "--log-every", "1", "--save-every", "0",
        "--run-dir", str(tmp_path / "run"), "--no-progress",
    ])  # fmt: skip
    driver.backend.config.training.max_norm = 0.01  # clipping bites: norms are from before
    probe, values = ModelStateProbe(FROZEN), HfValues()
    driver.callbacks += [probe, values]
    driver.fit()
    assert values.equal and all(values.equal.values()), values.equal
    expected = transformers_grad_norms(source, [first_byte_batch(SEQ, BATCH)], token_loss)
    check_probe(probe, expected)
    from transformers import AutoModelForCausalLM

    hf_names = {n for n, _ in AutoModelForCausalLM.from_pretrained(source).named_parameters()}
    assert {p.name for p in probe.state.parameters()} == hf_names


def _probe(facts: dict) -> ModelStateProbe:
    probe = ModelStateProbe(FROZEN)
    probe.__dict__.update(facts)
    probe.lr_logged = {int(k): v for k, v in facts["lr_logged"].items()}
    probe.watched_while_frozen = set(facts["watched_while_frozen"])
    return probe


def _stages(ranks: list[dict]) -> dict:
    """Two pipeline stages' facts as one model's: names and checks over both."""
    first, second = ranks
    assert first["grad_norms"] == second["grad_norms"]  # one sum over the ranks
    assert not set(first["layouts"]) & set(second["layouts"])  # each stage its own layers
    return {
        **first,
        "frozen_names": first["frozen_names"] + second["frozen_names"],
        "watched_while_frozen": first["watched_while_frozen"] + second["watched_while_frozen"],
        "frozen_unchanged": first["frozen_unchanged"] and second["frozen_unchanged"],
        "trained_again": first["trained_again"] or second["trained_again"],
        "layouts": {**first["layouts"], **second["layouts"]},
    }


def test_fsdp2_tp2_and_pp2_gradients_freeze_and_lr(tmp_path: Path):
    source = save_tiny_llama(tmp_path / "hf")
    torchrun(HERE / "model_state_worker.py", str(source), str(tmp_path))
    one_batch = transformers_grad_norms(source, [first_byte_batch(SEQ, BATCH)], token_loss)
    two_batches = [first_byte_batch(SEQ, BATCH, 2, rank) for rank in range(2)]
    expected = {
        "fsdp": transformers_grad_norms(source, two_batches, token_loss),
        "tp": one_batch,
        "pp": one_batch,
    }
    for layout in ("fsdp", "tp"):
        ranks = [json.loads((tmp_path / f"{layout}_rank{r}.json").read_text()) for r in range(2)]
        for facts in ranks:
            check_probe(_probe(facts), expected[layout])
        # each rank holds one of the two KV groups of the fused QKV (FSDP and TP: rows)
        q = "model.layers.0.self_attn.q_proj.weight"
        assert [facts["layouts"][q][0] for facts in ranks] == [[0, 1], [1, 2]], layout
    stages = [json.loads((tmp_path / f"pp_rank{r}.json").read_text()) for r in range(2)]
    merged = _stages(stages)
    check_probe(_probe(merged), expected["pp"])
    hf_names = {n for n, _ in load_llama(source).named_parameters()}
    assert set(merged["layouts"]) == hf_names
