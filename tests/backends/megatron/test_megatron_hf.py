"""One model, Megatron-Core: a Hugging Face Llama built as a Megatron ``GPTModel``
(RMSNorm, SwiGLU, RoPE, GQA, local layer spec), its weights loaded by baton's mapping,
trained through baton, exported back to a directory ``transformers`` loads."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

import torch

from baton.core.cli.recipe import build_driver
from support.megatron_model import megatron_outputs
from support.tiny_llama import load_llama, save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
VOCAB = 512


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("tie", [False, True])
def test_init_from_hf_logits_equal_transformers(tmp_path, tie):
    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=VOCAB, tie=tie)
    driver = build_driver(RECIPE, ["--init-from", str(hf_dir), "--run-dir", str(tmp_path / "r")])
    assert driver.options.settings["model_spec"]["tie_embeddings"] is tie
    got = megatron_outputs(driver.backend, _tokens())
    with torch.no_grad():
        expected = load_llama(hf_dir)(_tokens()).logits
    assert got.shape == expected.shape == (2, 32, VOCAB)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_mapping_round_trips_bit_for_bit(tmp_path):
    from baton.backends.hf_io import read_safetensors
    from baton.backends.megatron.hf import hf_to_megatron, megatron_to_hf
    from baton.core.model.spec import LlamaSpec

    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=VOCAB)
    spec = LlamaSpec.from_hf(hf_dir)
    weights = read_safetensors(str(hf_dir))
    back = megatron_to_hf(hf_to_megatron(weights, spec), spec)
    assert sorted(back) == sorted(weights)
    assert all(torch.equal(back[k], weights[k]) for k in weights)


def _checkpoint_logits(checkpoint: Path, hf_dir: Path, run_dir: Path) -> torch.Tensor:
    """Logits of a single-process Megatron model loaded from ``checkpoint`` by
    dist_checkpointing (resharded from whatever layout saved it)."""
    argv = [
        "--model-config",
        str(hf_dir),
        "--init-from",
        str(checkpoint),
        "--run-dir",
        str(run_dir),
    ]
    return megatron_outputs(build_driver(RECIPE, argv).backend, _tokens())


@pytest.mark.parametrize(
    "layout",
    [
        "single",
        pytest.param("tp2", marks=pytest.mark.slow),
        pytest.param("pp2", marks=pytest.mark.slow),
    ],
)
def test_export_loads_in_transformers_with_equal_logits(tmp_path, layout):
    """Train 2 steps from a HF Llama (one process, or TP 2 / PP 2 under torchrun), export
    with ``baton export``: transformers' logits equal the checkpoint's Megatron model's."""
    from baton.tools.export import main as export_main

    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=VOCAB)
    argv = [
        "--init-from", str(hf_dir), "--max-steps", "2", "--save-every", "2",
        "--no-async-save", "--run-dir", str(tmp_path / "run"), "--no-progress",
    ]  # fmt: skip
    if layout == "single":
        build_driver(RECIPE, argv).fit()
    else:
        from support.torchrun import torchrun

        flag = {"tp2": "--tp", "pp2": "--pp"}[layout]
        torchrun(Path(__file__).with_name("hf_worker.py"), str(RECIPE), *argv, flag, "2")
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    with torch.no_grad():
        got = load_llama(tmp_path / "out")(_tokens()).logits
    expected = _checkpoint_logits(checkpoint, hf_dir, tmp_path / "ref")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # trained: not the starting weights any more
        assert not torch.allclose(got, load_llama(hf_dir)(_tokens()).logits, atol=1e-3)


def prepared_corpus(tmp_path: Path) -> tuple[Path, Path]:
    """``(prefix, tokenizer directory)``: the reference documents prepared with a trained
    4,096-id tokenizer."""
    import json

    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    tokenizer = train_tokenizer(tmp_path / "tok", vocab_size=4096)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in reference_documents()))
    prepare([corpus], tokenizer, tmp_path / "corpus", workers=1)
    return tmp_path / "corpus", tokenizer.path


def test_a_4096_id_tokenizer_trains_with_no_other_flag(tmp_path):
    """The model's vocabulary follows the tokenizer of the prepared data."""
    prefix, tokenizer = prepared_corpus(tmp_path)
    driver = build_driver(
        RECIPE,
        [
            "--data-path",
            str(prefix),
            "--tokenizer",
            str(tokenizer),
            "--max-steps",
            "2",
            "--eval-every",
            "2",
            "--eval-split",
            "0.05",
            "--save-every",
            "0",
            "--log-every",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
            "--no-progress",
        ],
    )  # fmt: skip  (prepared data holds documents out for evaluation only when asked)
    result = driver.fit()
    assert result.step == 2 and driver.backend.padded_vocab_size >= 4096


def test_evaluating_prepared_text_that_holds_nothing_out_is_refused_before_training(
    tmp_path, capsys
):
    """Prepared pretraining data holds no document out unless asked: --eval-every alone is
    refused before training, naming the flags (the missing ability's short message), exit
    status 2, and no run directory written."""
    from baton.core.cli.command import main as baton

    prefix, tokenizer = prepared_corpus(tmp_path)
    code = baton([
        "run", str(RECIPE), "--data-path", str(prefix), "--tokenizer", str(tokenizer),
        "--max-steps", "2", "--eval-every", "2", "--run-dir", str(tmp_path / "run"),
        "--no-progress",
    ])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "holds no document out" in err and "--eval-split F" in err
    assert "--eval-every 0" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
