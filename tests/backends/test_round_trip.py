"""Checkpoints that move: train on backend X from one Hugging Face Llama, export with
``baton export --format hf``, load the export on backend Y; Y's logits equal the exported
model's (``transformers``). X and Y range over TorchTitan, Megatron-Core, Fabric (whose
model is ``transformers``' own) and MaxText (scanned layers, fp32). MaxText as a target
is set up once (``maxtext_tiny.py --init-from`` the source Llama, stopped before its
first step); each export then goes through the conversion ``--init-from`` runs
(``hf.write_params``) and MaxText's own ``load_params_from_path`` into that model."""

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

from baton.core.cli.recipe import build_driver
from support.megatron_model import megatron_outputs
from support.round_trip import (
    RECIPES,
    TRAIN,
    VOCAB,
    MaxTextLoads,
    export,
    megatron_target,
    prepared_corpus,
    targets,
    tokens,
    train_argv,
    window,
)
from support.round_trip import maxtext_target as load_maxtext_target
from support.tiny_llama import load_llama, save_tiny_llama
from support.titan_model import sdpa_model

TARGETS = ["torchtitan", "megatron", "fabric", "maxtext"]


def titan_logits(hf_dir: Path) -> torch.Tensor:
    """TorchTitan's model for the directory's spec, weights through TorchTitan's own
    ``Llama3StateDictAdapter.from_hf`` (SDPA attention, as on CPU)."""
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

    from baton.backends.hf_io import read_safetensors
    from baton.backends.torchtitan.hf import model_config
    from baton.core.model.spec import LlamaSpec

    config = model_config(LlamaSpec.from_hf(hf_dir))
    weights = Llama3StateDictAdapter(config, None).from_hf(read_safetensors(str(hf_dir)))
    with torch.no_grad():
        return sdpa_model(config, weights)(tokens())


def megatron_logits(
    hf_dir: Path, run_dir: Path, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Megatron-Core's GPTModel built by the recipe from ``--init-from hf_dir``; with
    ``labels``, its per-token losses (Megatron's own cross entropy) instead of logits."""
    return megatron_outputs(megatron_target(hf_dir, run_dir), tokens(), labels)


@pytest.fixture(scope="module")
def maxtext_target(exports) -> MaxTextLoads:
    """One MaxText model (fp32), built by ``maxtext_tiny.py --init-from`` the source Llama
    and stopped before its first step, then loaded with each backend's export."""
    root = exports["root"]
    return load_maxtext_target(root / "source", {n: exports[n] for n in TRAIN}, root)


def fabric_logits(hf_dir: Path, _run_dir: Path | None = None) -> torch.Tensor:
    """Fabric's model is transformers' LlamaForCausalLM from the directory."""
    with torch.no_grad():
        return load_llama(hf_dir)(tokens()).logits


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each backend trains 2 steps from the same HF Llama on the same tokenized data and
    exports its checkpoint."""
    root = tmp_path_factory.mktemp("round_trip")
    source = save_tiny_llama(root / "source", vocab_size=VOCAB)
    data = prepared_corpus(root)
    out: dict[str, Any] = {"root": root}
    for name, (recipe, extra) in TRAIN.items():
        run_dir = root / f"run-{name}"
        build_driver(RECIPES / recipe, train_argv(source, run_dir, data, extra)).fit()
        out[name] = export(run_dir, root / name)
    return out


@pytest.mark.parametrize("source", list(TRAIN))
@pytest.mark.parametrize("target", TARGETS)
def test_x_to_hf_to_y_computes_the_same_function(exports, source, target, request, tmp_path):
    hf_dir = exports[source]
    expected = fabric_logits(hf_dir)
    if target == "torchtitan":
        got = titan_logits(hf_dir)
    elif target == "megatron":
        got = megatron_logits(hf_dir, tmp_path / "m")
    elif target == "maxtext":
        got = request.getfixturevalue("maxtext_target").logits[source]
    else:
        got = fabric_logits(hf_dir)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_first_step_losses_of_the_four_backends_agree(exports, maxtext_target, tmp_path):
    """From the same Hugging Face weights, on the same batch, each backend's model and
    loss code give the loss of its first step: transformers' ``ForCausalLMLoss`` (Fabric
    trains ``transformers``' model), TorchTitan's ``cross_entropy_loss`` over its llama3
    model, Megatron-Core's GPTModel with its own cross entropy (``gpt_loss`` reduces it
    as the backend's step does), MaxText's ``eval_step`` (``train.loss_fn``) after its
    ``--init-from`` load. The batch is fixed here rather than read through each
    backend's data path: those cut and order the prepared tokens differently (Megatron's
    ``GPTDataset`` shuffles samples, MaxText's Grain reads its own order, TorchTitan
    restarts positions after each end-of-document token), so their step-1 batches
    differ. Measured (fp32): Megatron-Core's loss equals transformers' to the bit,
    TorchTitan's differs by 8e-8 relative, MaxText's by 2.4e-7. The remaining
    differences are floating-point order only: attention in different kernels (PyTorch
    SDPA in TorchTitan and transformers, Megatron-Core's DotProductAttention, XLA's
    ``dot_product`` attention in MaxText), MaxText's attention scale folded into the
    query kernel (``hf_to_maxtext``) instead of applied to the scores, XLA's own matmul
    and reduction order, and TorchTitan's rotary tables in complex form (cos/sin in the
    others)."""
    from torchtitan.components.loss import cross_entropy_loss

    from baton.backends.megatron.step import gpt_loss

    source = exports["root"] / "source"
    batch, labels = window(), targets()
    with torch.no_grad():
        fabric = float(load_llama(source)(input_ids=batch, labels=batch).loss)
    titan = float(cross_entropy_loss(titan_logits(source), labels)) / labels.numel()
    per_token = megatron_logits(source, tmp_path / "m", labels=labels)
    total, count, _ = gpt_loss(torch.ones_like(labels), per_token)
    losses = {
        "fabric": fabric,
        "torchtitan": titan,
        "megatron": float(total) / int(count),
        "maxtext": maxtext_target.loss,
    }
    expected = fabric_logits(source)
    torch.testing.assert_close(maxtext_target.logits["init-from"], expected, rtol=1e-4, atol=1e-4)
    print("first-step losses:", losses)
    assert losses["fabric"] > 6.0  # ln 512 = 6.24: an untrained model, a real loss
    for backend, value in losses.items():
        assert value == pytest.approx(losses["fabric"], rel=1e-4), (backend, losses)


class EndOfDocumentAt:
    """A ``transformers`` logits processor that makes ``token`` the only choice for the
    ``step``-th generated token (a 2-step model never picks it on its own)."""

    def __init__(self, prompt_length: int, step: int, token: int) -> None:
        self.position, self.token = prompt_length + step - 1, token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] == self.position:
            scores = torch.full_like(scores, -float("inf"))
            scores[:, self.token] = 0.0
        return scores


@pytest.mark.parametrize("source", list(TRAIN))
def test_generation_from_each_export_stops_at_the_end_of_document(exports, source):
    """Each backend's export carries the run tokenizer's special tokens (end of document
    ``<|endoftext|>`` id 0, padding id 1, not Llama's 1 and 2) in ``config.json`` and
    ``generation_config.json``, and its files: ``transformers`` generates from the export
    with the exported tokenizer and stops right after the end-of-document token."""
    import transformers

    from baton.data import load_tokenizer

    hf_dir = exports[source]
    end = load_tokenizer(exports["root"] / "tok").eod_id
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert (end, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 0, 1)
    config = model.config
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (0, 0, 1)
    generation = model.generation_config
    assert (generation.eos_token_id, generation.pad_token_id) == (end, 1)
    prompt = tokenizer("def square(x):", return_tensors="pt").input_ids
    stop = transformers.LogitsProcessorList([EndOfDocumentAt(prompt.shape[1], 3, end)])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=12, do_sample=False, logits_processor=stop)
    assert out.shape[1] == prompt.shape[1] + 3 and int(out[0, -1]) == end
