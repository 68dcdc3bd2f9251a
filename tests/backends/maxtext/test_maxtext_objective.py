"""An objective MaxText knows only from its declaration (the focal loss of
``examples/objectives/focal.py``: no native cross entropy) trains through MaxText's own
jitted step with baton's loss (``maxtext/objective_loss.py``): on the same weights and
packed conversations, the first step's loss, gradient norm and metric equal
``transformers`` computing the focal loss on each conversation alone, in fp32."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("maxtext")

from baton.core.cli.recipe import build_driver
from baton.core.objectives import OBJECTIVES, Objective, ObjectiveRun, register_objective
from baton.data.packed import PackedDataset
from support.posttrain import LoggedMetrics, chat_tokenizer, sft_prefix, tiny_model

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "recipes" / "maxtext_tiny.py"
FOCAL_FILE = ROOT / "examples" / "objectives" / "focal.py"
SEQ, ROWS, GAMMA = 128, 8, 1.5


def focal_declaration() -> Objective:
    """``FOCAL`` of the example file, imported from its path."""
    spec = importlib.util.spec_from_file_location("focal_example", FOCAL_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FOCAL


@pytest.fixture
def focal_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[Objective]:
    """The focal objective registered by name, as a plugin registers its own; removed
    afterwards, and any focal an earlier test loaded from its path restored (the registry
    is the process's)."""
    focal = focal_declaration()
    monkeypatch.delitem(OBJECTIVES._items, focal.name, raising=False)  # pyright: ignore[reportPrivateUsage]
    register_objective(focal)
    try:
        yield focal
    finally:
        OBJECTIVES._items.pop(focal.name, None)  # pyright: ignore[reportPrivateUsage]


def first_step(run_dir: Path, *flags: str) -> dict[str, float]:
    """The metrics of one fp32 step on all ``ROWS`` rows."""
    logged = LoggedMetrics()
    driver = build_driver(RECIPE, [
        "--max-steps", "1", "--log-every", "1", "--save-every", "0",
        "--no-callback", "checkpoint", "--batch-size", str(ROWS), "--seq-len", str(SEQ),
        "--run-dir", str(run_dir), "--no-progress", *flags,
        "--overrides", "dtype=float32", "matmul_precision=highest",
    ])  # fmt: skip
    assert driver is not None
    run = driver.backend.config.objective
    assert isinstance(run, ObjectiveRun) and run["focal_gamma"] == GAMMA
    driver.callbacks.append(logged)
    driver.fit()
    return logged.metrics[1]


def focal_reference(
    model_dir: Path, documents: Sequence[tuple[Sequence[int], Sequence[int]]], gamma: float
) -> dict[str, float]:
    """``transformers`` on each document alone: the focal loss ``-(1 - p) ** gamma * log p``
    summed over every supervised target and divided by their count, the 2-norm of its
    gradient, and the mean probability of the supervised targets (``focal/p``)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    total = sum(sum(mask[1:]) for _, mask in documents)
    loss = torch.zeros((), dtype=torch.float64)
    probability = torch.zeros((), dtype=torch.float64)
    for tokens, mask in documents:
        ids = torch.tensor([list(tokens)])
        logits = model(input_ids=ids).logits[0, :-1].float()
        logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        supervised = torch.tensor(list(mask[1:]), dtype=torch.float32)
        p = logps.exp()
        part = -(((1 - p) ** gamma) * logps * supervised).sum() / total
        part.backward()
        loss += part.detach().double()
        probability += (p * supervised).sum().detach().double()
    grads = [p.grad.double().flatten() for p in model.parameters() if p.grad is not None]
    return {
        "loss": float(loss),
        "grad_norm": float(torch.cat(grads).norm()),
        "focal/p": float(probability / total),
        "items": float(total),
    }


def documents_of(prefix: Path, rows: range) -> list[tuple[list[int], list[int]]]:
    data = PackedDataset(str(prefix))
    return [
        ([int(t) for t in tokens], [int(m) for m in mask])
        for r in rows
        for tokens, mask in data.row(r)
    ]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_tokenizer(tmp_path_factory.mktemp("tok"))


def check_first_step(first: dict[str, Any], model: Path, prefix: Path) -> None:
    expected = focal_reference(model, documents_of(prefix, range(ROWS)), GAMMA)
    assert first["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert first["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    assert first["focal/p"] == pytest.approx(expected["focal/p"], rel=1e-5)
    assert first["total_weights"] == expected["items"]  # the supervised tokens
    assert "lm_loss" not in first and "perplexity" not in first  # not a cross entropy


def test_registered_focal_objective_equals_transformers(tmp_path, tokenizer, focal_registered):
    """``--objective focal`` once a plugin registered it: its flags come from its
    declaration, and MaxText's step computes its loss. A Qwen3 (its query kernel is
    Hugging Face's, unscaled, so the gradients compare)."""
    model = tiny_model(tmp_path / "model", family="qwen3")
    prefix = sft_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=ROWS)
    first = first_step(
        tmp_path / "run", "--objective", focal_registered.name, "--focal-gamma", str(GAMMA),
        "--init-from", str(model), "--tokenizer", str(tokenizer), "--data-path", str(prefix),
    )  # fmt: skip
    check_first_step(first, model, prefix)


def test_focal_objective_from_its_file_equals_transformers(tmp_path, tokenizer):
    """``--objective examples/objectives/focal.py:FOCAL``: the declaration read from its
    file, nothing registered beforehand."""
    model = tiny_model(tmp_path / "model", family="qwen3")
    prefix = sft_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=ROWS)
    first = first_step(
        tmp_path / "run", "--objective", f"{FOCAL_FILE}:FOCAL", "--focal-gamma", str(GAMMA),
        "--init-from", str(model), "--tokenizer", str(tokenizer), "--data-path", str(prefix),
    )  # fmt: skip
    check_first_step(first, model, prefix)
