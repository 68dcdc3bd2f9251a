"""Post-training on MaxText under a parallel layout: FSDP over 2 simulated CPU devices and
MaxText's gradient accumulation over 2 micro-batches (``posttrain_mesh_run.py``, a fresh
process). The first SFT loss and gradient norm still equal ``transformers`` on each
conversation alone, and the first DPO loss TRL's: the loss is the mean over the supervised
tokens (the pairs) of the global batch, whatever splits it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("maxtext")

from support.posttrain import (
    chat_tokenizer,
    dpo_reference,
    preference_prefix,
    sft_prefix,
    sft_reference,
    tiny_model,
)

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SEQ, ROWS = 128, 8


def test_fsdp_2_with_accumulation_equals_the_references(tmp_path):
    tokenizer = chat_tokenizer(tmp_path / "tok")
    sft_model = tiny_model(tmp_path / "sft-model", family="qwen3")
    sft_data = sft_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=ROWS)
    policy = tiny_model(tmp_path / "policy", family="llama", seed=0)
    reference = tiny_model(tmp_path / "reference", family="llama", seed=1)
    pairs = preference_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=ROWS)
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env |= {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}
    arguments = [tokenizer, sft_model, sft_data, policy, reference, pairs, ROWS, SEQ]
    done = subprocess.run(
        [sys.executable, str(HERE / "posttrain_mesh_run.py"), str(out), str(tmp_path / "runs")]
        + [str(a) for a in arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    sft, dpo = report["sft"], report["dpo"]
    assert (sft["devices"], sft["fsdp"]) == (2, 2)
    loss, grad_norm = sft_reference(sft_model, sft_data, range(ROWS))
    assert sft["loss"] == pytest.approx(loss, rel=1e-5)
    assert sft["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    expected = dpo_reference(policy, reference, pairs, range(ROWS), 0.2, "sigmoid")
    assert dpo["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert dpo["rewards/margins"] == pytest.approx(expected["rewards/margins"], rel=1e-4)
