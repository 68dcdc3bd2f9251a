"""An objective Fabric knows only from its declaration (the focal example,
``examples/objectives/focal.py``) trains through Fabric's one generic loss path: the
first step's loss, gradient norm and metric equal ``transformers`` on each conversation
alone with the focal loss computed here, over every micro-batch of the global batch."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from baton.core.objectives import Objective, ObjectiveRun
from baton.data.packed import PackedDataset
from support.posttrain import LoggedMetrics, _documents, _load_model, posttrain_files

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
FOCAL_FILE = ROOT / "examples" / "objectives" / "focal.py"
SEQ_LEN = 96

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("focal"), SEQ_LEN, num_rows=8, kinds=["sft"])


def focal_declaration() -> Objective:
    """``FOCAL`` of the example file, imported as the file it is (not a package)."""
    spec = importlib.util.spec_from_file_location("focal_example", FOCAL_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FOCAL


def focal_reference(model_dir: Path, prefix: Path, rows: list[int], gamma: float) -> dict:
    """``transformers`` on each document of ``rows`` alone, unpacked: the focal loss
    ``-(1 - p) ** gamma * log p`` summed over every supervised target of the step and
    divided by their count, its gradient's 2-norm, and the mean ``p`` of the targets."""
    model = _load_model(model_dir)
    documents = _documents(prefix, rows)
    total = sum(sum(mask) for _, mask in documents)
    loss, p_sum = torch.zeros((), dtype=torch.float64), 0.0
    for tokens, mask in documents:
        ids = torch.tensor([tokens])
        logits = model(input_ids=ids).logits[0, :-1].float()
        logps = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        supervised = torch.tensor(mask[1:], dtype=torch.float32)
        p = logps.exp()
        part = -(((1 - p) ** gamma) * logps * supervised).sum() / total
        part.backward()
        loss += part.detach().double()
        p_sum += float((p.detach() * supervised).sum())
    grads = [q.grad.double().flatten() for q in model.parameters() if q.grad is not None]
    return {
        "loss": float(loss),
        "grad_norm": float(torch.cat(grads).norm()),
        "focal/p": p_sum / total,
    }


class Evaluated(LoggedMetrics):
    """Every log step's metrics, and the last evaluation's."""

    def __init__(self) -> None:
        super().__init__()
        self.evaluated: dict[str, float] = {}

    def on_eval_end(self, driver: Any, metrics: dict[str, float]) -> None:
        self.evaluated = dict(metrics)


def first_rows(prefix: Path, batch_size: int, count: int) -> list[int]:
    from baton.backends.fabric.hf_posttrain import packed_loaders

    train, _ = packed_loaders(PackedDataset(prefix), batch_size=batch_size, seed=0, pad_id=0)
    return train.order(0)[:count].tolist()


@pytest.mark.parametrize("gamma", [0.0, 2.0])
def test_the_focal_objective_trains_through_the_generic_loss(files, tmp_path, gamma):
    """FabricBackend with ``ObjectiveLoss`` and ``ObjectiveItems`` of the declaration
    alone, two micro-batches of 2 rows: one mean over the step's supervised targets
    (gamma 0 is SFT's loss), and its metric one mean over them too."""
    from torch.utils.data import default_collate
    from transformers import AutoConfig, AutoModelForCausalLM

    from baton.backends.fabric import FabricBackend, FabricConfig
    from baton.backends.fabric.hf_posttrain import packed_loaders
    from baton.backends.fabric.objective_loss import ObjectiveItems, ObjectiveLoss
    from baton.backends.fabric.posttrain import PackedRows
    from baton.core import Driver

    run = ObjectiveRun.of(focal_declaration(), focal_gamma=gamma)
    config = AutoConfig.from_pretrained(files["policy"])
    data = PackedDataset(files["sft"])
    train, _ = packed_loaders(data, batch_size=2, seed=0, pad_id=0)
    rows = PackedRows(data, pad_id=0)
    val = [default_collate([rows[0], rows[1]])]  # evaluation: each metric one batch's mean
    backend = FabricBackend(
        model=lambda: AutoModelForCausalLM.from_config(config),
        optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=1e-3),
        data=train,
        eval_data=val,
        loss_fn=ObjectiveLoss(run),
        mean_over=ObjectiveItems(run),
        config=FabricConfig(accelerator="cpu", grad_accum=2, grad_clip=1.0, seed=0,
                            init_from=str(files["policy"])),
    )  # fmt: skip
    record = Evaluated()
    Driver(
        backend, [record], max_steps=1, log_every=1, eval_every=1, run_dir=str(tmp_path / "run")
    ).fit()
    want = focal_reference(files["policy"], files["sft"], first_rows(files["sft"], 2, 4), gamma)
    got = record.metrics[1]
    for name in ("loss", "grad_norm", "focal/p"):
        assert got[name] == pytest.approx(want[name], rel=1e-5), name
    evaluated = record.evaluated
    assert math.isfinite(evaluated["eval/loss"]) and 0 < evaluated["eval/focal/p"] < 1, evaluated


def test_the_recipe_trains_the_focal_example_from_its_file(files, tmp_path):
    """``recipes/hf_finetune.py --objective examples/objectives/focal.py:FOCAL``: the
    recipe hands Fabric the declaration and nothing else; its first step equals the
    focal loss computed with ``transformers`` on each conversation alone."""
    from baton.core.cli.recipe import build_driver

    argv = ["--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"])]
    argv += ["--objective", f"{FOCAL_FILE}:FOCAL", "--focal-gamma", "2"]
    argv += ["--data-path", str(files["sft"]), "--batch-size", "4"]
    argv += ["--max-steps", "1", "--log-every", "1", "--eval-every", "0", "--save-every", "0"]
    driver = build_driver(RECIPE, [*argv, "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert driver is not None
    record = LoggedMetrics()
    driver.callbacks.append(record)
    driver.fit()
    want = focal_reference(files["policy"], files["sft"], first_rows(files["sft"], 4, 4), 2.0)
    got: dict[str, Any] = record.metrics[1]
    for name in ("loss", "grad_norm", "focal/p"):
        assert got[name] == pytest.approx(want[name], rel=1e-5), name
