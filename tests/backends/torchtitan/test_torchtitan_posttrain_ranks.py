"""SFT and DPO on TorchTitan over two CPU ranks (torchrun, gloo): under FSDP 2 and TP 2
the first step's loss (and SFT's gradient norm) equal the references outside baton on the
step's rows, as on one rank (``test_torchtitan_sft.py``, ``test_torchtitan_dpo.py``).

FSDP 2 reads one row per rank (the global batch is rows 0 and 1); TP 2 reads both rows on
each rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from support.posttrain import (
    dpo_reference,
    posttrain_files,
    sft_reference,
)
from support.torchrun import torchrun

HERE = Path(__file__).parent
SEQ = 96
LAYOUTS = {"fsdp2": ["--dp-shard", "2", "--batch-size", "1"],
           "tp2": ["--dp-shard", "1", "--tp", "2", "--batch-size", "2"]}  # fmt: skip


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("titan_posttrain_ranks"), SEQ)


def run_ranks(tmp_path: Path, assets: dict[str, Path], *args: str) -> dict[str, float]:
    torchrun(HERE / "posttrain_worker.py", str(tmp_path), *args,
        "--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
        "--seq-len", str(SEQ), "--max-steps", "1", "--log-every", "1", "--save-every", "0",
        "--run-dir", str(tmp_path / "run"), "--no-progress",
    )  # fmt: skip
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        rank.pop("train_time_s", None)
    assert ranks[0] == ranks[1]  # the global values, on every rank
    return ranks[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sft_on_two_ranks_equals_transformers(assets, layout, tmp_path):
    first = run_ranks(tmp_path, assets, "--objective", "sft", "--data-path",
                      str(assets["sft"]), *LAYOUTS[layout])  # fmt: skip
    loss, grad_norm = sft_reference(assets["policy"], assets["sft"], rows=[0, 1])
    assert first["loss"] == pytest.approx(loss, rel=1e-5)
    assert first["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)


@pytest.mark.slow
def test_dpo_under_fsdp2_equals_trl(assets, tmp_path):
    first = run_ranks(tmp_path, assets, "--objective", "dpo", "--data-path",
                      str(assets["pairs"]), "--reference", str(assets["reference"]),
                      *LAYOUTS["fsdp2"])  # fmt: skip
    trl = dpo_reference(assets["policy"], assets["reference"], assets["pairs"], rows=[0, 1])
    assert first["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    assert first["rewards/margins"] == pytest.approx(trl["rewards/margins"], rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_dpo_under_tp2_equals_trl(assets, tmp_path):
    """The vocabulary-sharded logits are gathered by TorchTitan's ``compute_logprobs``
    before the per-token log-probabilities DPO's loss reads (each rank: both rows)."""
    first = run_ranks(tmp_path, assets, "--objective", "dpo", "--data-path",
                      str(assets["pairs"]), "--reference", str(assets["reference"]),
                      *LAYOUTS["tp2"])  # fmt: skip
    trl = dpo_reference(assets["policy"], assets["reference"], assets["pairs"], rows=[0, 1])
    assert first["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    assert first["rewards/margins"] == pytest.approx(trl["rewards/margins"], rel=1e-4, abs=1e-5)
