"""Checkpoints that move, mixture of experts: each of the four backends trains a tiny
Hugging Face Qwen3-MoE (4 experts, top 2, both layers sparse) for 2 steps and exports it
with ``baton export --format hf``; each backend loads each export and computes the
exported model's function (``transformers``' ``Qwen3MoeForCausalLM``). Megatron-Core
trains at expert parallel 2 (two gloo ranks, 2 experts each) and exports from that layout.
TorchTitan loads through its own ``Qwen3StateDictAdapter``, Megatron-Core through the
recipe's ``--init-from``, MaxText through one target model (set up once) loaded with every
export, as in ``test_round_trip.py``. Then the four first-step losses on one fixed batch
from the source weights: the cross entropies agree, and each backend's load-balancing term
is its own formula (see ``docs/one-model.md``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("megatron.core")
pytest.importorskip("maxtext")
pytest.importorskip("transformers")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch

from baton.core.cli.recipe import build_driver
from support.maxtext_forward import maxtext_aux_loss
from support.megatron_model import megatron_aux_loss, megatron_losses, megatron_outputs
from support.round_trip import (
    RECIPES,
    TRAIN,
    VOCAB,
    MaxTextLoads,
    export,
    maxtext_target,
    megatron_target,
    prepared_corpus,
    targets,
    tokens,
    train_argv,
)
from support.tiny_qwen3 import TINY_EXPERTS, save_tiny_qwen3
from support.titan_model import sdpa_model
from support.torchrun import torchrun

TARGETS = ["torchtitan", "megatron", "fabric", "maxtext"]
TOP_K, EXPERTS = TINY_EXPERTS["num_experts_per_tok"], TINY_EXPERTS["num_experts"]
COEF = TINY_EXPERTS["router_aux_loss_coef"]
EP_WORKER = Path(__file__).parent / "megatron" / "hf_worker.py"


def hf_model(hf_dir: Path) -> Any:
    """``transformers``' Qwen3-MoE from the directory (fp32, eval): Fabric's model."""
    from transformers import Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


def fabric_logits(hf_dir: Path) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(hf_dir)(tokens()).logits


def titan_logits(hf_dir: Path) -> torch.Tensor:
    """TorchTitan's qwen3 model with its MoE layers for the directory's spec, weights
    through TorchTitan's own ``Qwen3StateDictAdapter.from_hf`` (SDPA attention)."""
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

    from baton.backends.hf_io import read_safetensors
    from baton.backends.torchtitan.qwen3 import qwen3_model_config
    from baton.core.model.spec import ModelSpec

    config = qwen3_model_config(ModelSpec.from_hf(hf_dir))
    weights = Qwen3StateDictAdapter(config, None).from_hf(read_safetensors(str(hf_dir)))
    with torch.no_grad():
        return sdpa_model(config, weights)(tokens())


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each backend trains 2 steps from the same Qwen3-MoE on the same tokenized data and
    exports its checkpoint; Megatron-Core at expert parallel 2 under torchrun."""
    root = tmp_path_factory.mktemp("round_trip_moe")
    source = save_tiny_qwen3(root / "source", moe=True, vocab_size=VOCAB)
    data = prepared_corpus(root)
    out: dict[str, Any] = {"root": root, "source": source}
    for name, (recipe, extra) in TRAIN.items():
        run_dir = root / f"run-{name}"
        argv = train_argv(source, run_dir, data, extra)
        if name == "megatron":
            torchrun(EP_WORKER, str(RECIPES / recipe), *argv, "--ep", "2", "--no-progress")
        else:
            build_driver(RECIPES / recipe, argv).fit()
        out[name] = export(run_dir, root / name)
    return out


@pytest.fixture(scope="module")
def maxtext(exports) -> MaxTextLoads:
    """One MaxText Qwen3-MoE (fp32) from the source, loaded with each backend's export."""
    return maxtext_target(exports["source"], {n: exports[n] for n in TRAIN}, exports["root"])


@pytest.mark.parametrize("source", list(TRAIN))
@pytest.mark.parametrize("target", TARGETS)
def test_x_to_hf_to_y_computes_the_same_moe_function(exports, source, target, request, tmp_path):
    hf_dir = exports[source]
    expected = fabric_logits(hf_dir)
    if target == "torchtitan":
        got = titan_logits(hf_dir)
    elif target == "megatron":
        got = megatron_outputs(megatron_target(hf_dir, tmp_path / "m"), tokens())
    elif target == "maxtext":
        got = request.getfixturevalue("maxtext").logits[source]
    else:
        got = fabric_logits(hf_dir)
    assert not torch.allclose(expected, fabric_logits(exports["source"]), atol=1e-3)  # trained
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_first_step_moe_losses_of_the_four_backends(exports, maxtext, tmp_path):
    """From the same Qwen3-MoE weights, on one fixed batch (2 x 32 tokens), each
    backend's model and loss code: transformers' loss with ``output_router_logits``
    (Fabric's), TorchTitan's ``cross_entropy_loss`` over its qwen3 model, Megatron-Core's
    GPTModel in training mode (its cross entropy, ``gpt_loss`` reduced, and the router's
    ``load_balancing_loss`` from its tracker), MaxText's ``eval_step`` (cross entropy and
    ``moe_lb_loss``). The cross entropies agree within 1e-4 relative; the load-balancing
    terms differ by formula, each its backend's own recomputed from ``transformers``'
    router logits: ``transformers``' pools every layer's tokens into one Switch loss;
    Megatron-Core sums a Switch loss per layer with token fractions over top k;
    MaxText's is per sequence, averaged over sequences and layers, weight coef x top k;
    TorchTitan adds none."""
    from torchtitan.components.loss import cross_entropy_loss

    from baton.backends.megatron.step import gpt_loss

    source = exports["source"]
    labels = targets()
    with torch.no_grad():
        out = hf_model(source)(tokens(), output_router_logits=True)
    routers = [logits.detach() for logits in out.router_logits]  # 64 tokens a layer
    hf_ce = float(torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten()))
    per_token, megatron_aux = megatron_losses(
        megatron_target(source, tmp_path / "m"), tokens(), labels
    )
    total, count, _ = gpt_loss(torch.ones_like(labels), per_token)
    cross_entropy = {
        "fabric": hf_ce,
        "torchtitan": float(cross_entropy_loss(titan_logits(source), labels)) / labels.numel(),
        "megatron": float(total) / int(count),
        "maxtext": maxtext.loss,
    }
    aux = {
        "fabric": COEF * float(out.aux_loss),  # as Fabric's loss adds it
        "torchtitan": 0.0,
        "megatron": megatron_aux,
        "maxtext": maxtext.aux_loss,
    }
    print("first-step cross entropy:", cross_entropy, "load-balancing terms:", aux)
    assert hf_ce > 6.0  # ln 512 = 6.24: an untrained model, a real loss
    for backend, value in cross_entropy.items():
        assert value == pytest.approx(hf_ce, rel=1e-4), (backend, cross_entropy)
    megatron_formula = COEF * float(megatron_aux_loss(routers, top_k=TOP_K, experts=EXPERTS))
    assert aux["megatron"] == pytest.approx(megatron_formula, rel=1e-4)
    maxtext_formula = maxtext_aux_loss(routers, top_k=TOP_K, coef=COEF, sequences=2)
    assert aux["maxtext"] == pytest.approx(maxtext_formula, rel=1e-4)
    # the same scale (coef x top k at perfect balance), other pooling: a few per cent
    for backend in ("megatron", "maxtext"):
        assert aux[backend] == pytest.approx(aux["fabric"], rel=0.1), (backend, aux)
