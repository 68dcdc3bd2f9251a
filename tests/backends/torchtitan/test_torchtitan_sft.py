"""Supervised fine-tuning on TorchTitan: packed conversations through TorchTitan's own
inputs (labels at its ignore index, positions restarting per document, attention that
never crosses a document) with ``Trainer.train_step`` running the step.

The first step's loss and gradient norm equal ``transformers`` computing every
conversation of the step's rows on its own, unpacked (``support.posttrain.sft_reference``),
on the same weights (``--init-from`` a tiny Hugging Face Llama), in fp32. On CPU the
documents are masked by SDPA under TorchTitan's document mask (the
``torchtitan_cpu_attention`` patch); on a machine with a GPU the same tests run
TorchTitan's FlexAttention with its ``block_causal`` mask, no patch involved::

    OMP_NUM_THREADS=1 uv run --frozen pytest -q tests/backends/torchtitan/test_torchtitan_sft.py \
        tests/backends/torchtitan/test_torchtitan_dpo.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchtitan")

from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from support.posttrain import (
    LoggedMetrics,
    posttrain_files,
    sft_reference,
)

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
SEQ, BATCH = 96, 2


class Logged(LoggedMetrics):
    """Every log step's metrics and the inner attention the model was built with."""

    attention = ""

    def on_train_start(self, driver: Any) -> None:
        layer = driver.backend.trainer.model_parts[0].layers["0"]
        self.attention = type(layer.attention.inner_attention).__name__


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("titan_sft")
    return {"root": root, **posttrain_files(root, SEQ, kinds=("sft",))}


def sft_args(assets: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        "--objective", "sft", "--data-path", str(assets["sft"]),
        "--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
        "--seq-len", str(SEQ), "--batch-size", str(BATCH), "--max-steps", "1",
        "--log-every", "1", "--save-every", "0", "--run-dir", str(run_dir), "--no-progress",
        *extra,
    ]  # fmt: skip


def test_first_sft_step_equals_transformers_on_each_conversation(assets):
    """On a GPU: TorchTitan's FlexAttention with its block_causal mask from the
    positions; on CPU: SDPA under the same document mask (``DocumentSdpa``)."""
    import torch

    logged = Logged()
    driver = build_driver(RECIPE, sft_args(assets, assets["root"] / "run"))
    driver.callbacks.append(logged)
    driver.fit()
    loss, grad_norm = sft_reference(assets["policy"], assets["sft"], rows=range(BATCH))
    first = logged.metrics[1]
    assert logged.attention == ("FlexAttention" if torch.cuda.is_available() else "DocumentSdpa")
    assert first["loss"] == pytest.approx(loss, rel=1e-5)
    assert first["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)


def test_sft_data_in_a_pretraining_run_is_refused_before_the_build(assets, tmp_path):
    args = sft_args(assets, tmp_path / "run")
    args[1] = "pretrain"
    with pytest.raises(UsageError, match="--objective sft"):
        build_driver(RECIPE, args)


def test_pretraining_data_in_an_sft_run_is_refused_before_the_build(assets, tmp_path):
    from baton.tools.data.cli import main as data_main

    text = tmp_path / "corpus.jsonl"
    text.write_text('{"text": "a few words of plain text"}\n' * 20)
    prefix = tmp_path / "corpus"
    assert data_main([
        "prepare", str(text), "--tokenizer", str(assets["tokenizer"]), "--output", str(prefix),
    ]) == 0  # fmt: skip
    args = sft_args(assets, tmp_path / "run")
    args[3] = str(prefix)
    with pytest.raises(UsageError, match="pretraining text"):
        build_driver(RECIPE, args)


def test_chat_templates_with_generation_tags_load_in_torchtitans_tokenizer(assets):
    """TorchTitan refuses the template alone; under the patch it renders what
    transformers renders, and the undo restores TorchTitan's method."""
    from jinja2 import TemplateSyntaxError
    from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer
    from transformers import AutoTokenizer

    from baton.backends.torchtitan.patches import TorchTitanChatTemplateGeneration
    from baton.core.patches import PatchRecorder

    path = str(assets["tokenizer"])
    with pytest.raises(TemplateSyntaxError, match="unknown tag 'generation'"):
        HuggingFaceTokenizer(tokenizer_path=path)
    original = BaseTokenizer.set_chat_template
    recorder = PatchRecorder()
    TorchTitanChatTemplateGeneration().apply(None, recorder)  # type: ignore[arg-type]
    try:
        titan = HuggingFaceTokenizer(tokenizer_path=path)
    finally:
        recorder.undo()
    assert BaseTokenizer.set_chat_template is original
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the cat"}]
    expected = AutoTokenizer.from_pretrained(path).apply_chat_template(messages, tokenize=False)
    assert titan.apply_chat_template(messages) == expected


def test_a_sequence_length_other_than_the_rows_is_refused_before_the_build(assets, tmp_path):
    args = sft_args(assets, tmp_path / "run")
    args[args.index("--seq-len") + 1] = "64"
    with pytest.raises(UsageError, match=f"rows of {SEQ} tokens.*pass --seq-len {SEQ}"):
        build_driver(RECIPE, args)


def test_torchtitans_pretraining_loader_refuses_packed_conversations(assets):
    from baton.backends.torchtitan.data import RankShare
    from baton.backends.torchtitan.prepared import PreparedDataLoader
    from baton.data import DataError

    config = PreparedDataLoader.Config(dataset_path=str(assets["sft"]))
    with pytest.raises(DataError, match="--objective sft"):
        PreparedDataLoader.build_dataset(config, None, RankShare(SEQ, 0, 1))  # type: ignore[arg-type]
