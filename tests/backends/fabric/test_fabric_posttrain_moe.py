"""SFT and DPO of a Qwen3-MoE on the Fabric backend (recipes/hf_finetune.py): the first
step equals ``transformers`` on each conversation alone plus its own load-balancing loss
over the same tokens, and TRL's ``DPOTrainer``, which adds that term too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baton.core.cli.recipe import build_driver
from baton.data.packed import PackedDataset
from support.posttrain import (
    LoggedMetrics,
    _documents,
    _load_model,
    dpo_reference,
    posttrain_files,
)
from support.tiny_qwen3 import TINY_EXPERTS

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
SEQ_LEN = 96
COEF = TINY_EXPERTS["router_aux_loss_coef"]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("posttrain_moe"), SEQ_LEN, family="qwen3_moe")


def run(files: dict[str, Path], tmp_path: Path, *args: str) -> dict[str, float]:
    """The first step's logged metrics of the recipe, every row in one batch."""
    argv = ["--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"])]
    argv += ["--max-steps", "1", "--log-every", "1", "--eval-every", "0", "--save-every", "0"]
    argv += ["--run-dir", str(tmp_path / "run"), "--no-progress", *args]
    driver = build_driver(RECIPE, argv)
    record = LoggedMetrics()
    driver.callbacks.append(record)
    driver.fit()
    return record.metrics[1]


def balancing_loss(router_logits: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """``transformers``' load-balancing loss over the tokens of several forward passes
    pooled (each layer's router logits concatenated), as one batch without padding."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    layers = tuple(torch.cat(parts) for parts in zip(*router_logits, strict=True))
    return load_balancing_loss_func(
        layers, TINY_EXPERTS["num_experts"], TINY_EXPERTS["num_experts_per_tok"]
    )


def test_moe_sft_first_step_equals_transformers_on_each_conversation(files, tmp_path):
    rows = PackedDataset(files["sft"]).num_rows
    got = run(
        files, tmp_path, "--objective", "sft", "--data-path", str(files["sft"]),
        "--batch-size", str(rows),
    )  # fmt: skip
    model = _load_model(files["policy"])
    documents = _documents(files["sft"], range(rows))
    total = sum(sum(mask) for _, mask in documents)
    last_of_row = {len(_documents(files["sft"], range(r + 1))) - 1 for r in range(rows)}
    cross_entropy, routers = torch.zeros(()), []
    for index, (tokens, mask) in enumerate(documents):
        ids = torch.tensor([list(tokens)])
        labels = ids.masked_fill(torch.tensor([list(mask)]) == 0, -100)
        output = model(input_ids=ids, output_router_logits=True)
        cross_entropy = cross_entropy + model.loss_function(
            output.logits, labels, model.config.vocab_size, num_items_in_batch=total
        )
        # a row's last token predicts nothing, so it is no input and is not routed
        kept = len(tokens) - 1 if index in last_of_row else len(tokens)
        routers.append(tuple(layer[:kept] for layer in output.router_logits))
    aux = COEF * balancing_loss(routers)
    (cross_entropy + aux).backward()
    grad_norm = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert float(aux) > 0.0
    assert got["moe/aux_loss"] == pytest.approx(float(aux), rel=1e-5)
    assert got["loss"] == pytest.approx(float(cross_entropy + aux), rel=1e-5)
    assert got["grad_norm"] == pytest.approx(float(grad_norm.norm()), rel=1e-5)
    assert got["moe/load_balance"] >= 1.0


def test_moe_dpo_first_step_equals_trl(files, tmp_path):
    rows = PackedDataset(files["pairs"]).num_rows
    got = run(
        files, tmp_path, "--objective", "dpo", "--data-path", str(files["pairs"]),
        "--reference", str(files["reference"]), "--batch-size", str(rows),
    )  # fmt: skip
    trl = dpo_reference(files["policy"], files["reference"], files["pairs"], list(range(rows)))
    # TRL's load-balancing term also routes each row's last token (a rejected answer's
    # end), which has no next token and is no input of a packed row: the DPO losses
    # agree within 1e-5 and the terms within 1e-3
    assert got["loss"] - got["moe/aux_loss"] == pytest.approx(
        trl["loss"] - COEF * trl["aux_loss"], rel=1e-5
    )
    assert got["moe/aux_loss"] == pytest.approx(COEF * trl["aux_loss"], rel=1e-3)
    for name in ("logps/chosen", "logps/rejected"):
        assert got[name] == pytest.approx(trl[name], rel=1e-5), name
