"""An objective Megatron-Core knows only by its declaration runs through its one generic
loss path: the focal example (``examples/objectives/focal.py``: log-probabilities from
Megatron's per-token cross entropy) and a tempered objective
(``support/tempered_objective.py``: log-probabilities at a temperature and the entropy,
from the vocab-parallel logits). The first step's loss, metric and gradient norm equal a
direct ``transformers`` computation on the same conversations, each alone, unpacked; on
one rank and under tensor parallel 2 (each rank a half of the vocabulary)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")

from baton.core.cli.recipe import build_driver
from baton.core.objectives import OBJECTIVES, Objective
from support.posttrain import LoggedMetrics, posttrain_files

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "recipes" / "megatron_gpt_tiny.py"
FOCAL_FILE = ROOT / "examples" / "objectives" / "focal.py"
TEMPERED_FILE = ROOT / "tests" / "support" / "tempered_objective.py"
SEQ_LEN = 128
ROWS = [0, 1, 2, 3]
GAMMA, TEMPERATURE = 2.0, 0.7


def declared(path: Path, name: str) -> Objective:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("objective"), SEQ_LEN, kinds=("sft",))


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The focal and tempered objectives known by name for the test (as a plugin
    registers its own), forgotten after it."""
    for path, name in ((FOCAL_FILE, "FOCAL"), (TEMPERED_FILE, "TEMPERED")):
        objective = declared(path, name)
        monkeypatch.setitem(OBJECTIVES._items, objective.name, objective)  # pyright: ignore[reportPrivateUsage]
    yield


def run_argv(fixtures: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        "--init-from", str(fixtures["policy"]), "--tokenizer", str(fixtures["tokenizer"]),
        "--data-path", str(fixtures["sft"]), "--seq-len", str(SEQ_LEN), "--batch-size", "2",
        "--global-batch-size", "4", "--max-steps", "1", "--log-every", "1", "--save-every",
        "0", "--no-async-save", "--no-progress", "--run-dir", str(run_dir), *extra,
    ]  # fmt: skip


def direct_reference(
    model_dir: Path, prefix: Path, rows: Sequence[int], *, gamma: float | None, temperature: float
) -> dict[str, float]:
    """``transformers`` on each document of ``rows`` alone: the loss (the focal loss with
    ``gamma``, else the negative log-likelihood, of ``logits / temperature``) summed over
    the supervised targets of all documents and divided by their count, its gradient's
    2-norm, and the mean over those targets of ``p`` and of the entropy."""
    import torch
    from transformers import AutoModelForCausalLM

    from baton.data.packed import PackedDataset

    data = PackedDataset(str(prefix))
    documents = [document for r in rows for document in data.row(r)]
    total = sum(int(mask.sum()) for _, mask in documents)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    loss = torch.zeros((), dtype=torch.float64)
    p_sum = torch.zeros((), dtype=torch.float64)
    entropy_sum = torch.zeros((), dtype=torch.float64)
    for tokens, mask in documents:
        ids = torch.tensor(tokens, dtype=torch.long)[None]
        logits = model(input_ids=ids).logits[0, :-1].float() / temperature
        logps = torch.log_softmax(logits, dim=-1)
        target = logps.gather(-1, ids[0, 1:, None])[:, 0]
        supervised = torch.tensor(mask[1:], dtype=torch.float32)
        per_token = -target if gamma is None else -((1 - target.exp()) ** gamma) * target
        part = (per_token * supervised).sum() / total
        part.backward()
        loss += part.detach().double()
        p_sum += (target.detach().exp() * supervised).sum().double()
        entropy = -(logps.detach().exp() * logps.detach()).sum(dim=-1)
        entropy_sum += (entropy * supervised).sum().double()
    grads = [p.grad.double().flatten() for p in model.parameters() if p.grad is not None]
    return {
        "loss": float(loss),
        "grad_norm": float(torch.cat(grads).norm()),
        "p": float(p_sum / total),
        "entropy": float(entropy_sum / total),
    }


def first_step(argv: list[str]) -> dict[str, Any]:
    driver = build_driver(RECIPE, argv)
    assert driver is not None
    record = LoggedMetrics()
    driver.callbacks.append(record)
    driver.fit()
    return record.metrics[1]


def check_focal(got: dict[str, Any], fixtures: dict[str, Path]) -> None:
    want = direct_reference(fixtures["policy"], fixtures["sft"], ROWS, gamma=GAMMA, temperature=1.0)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    assert got["focal/p"] == pytest.approx(want["p"], rel=1e-5)


def check_tempered(got: dict[str, Any], fixtures: dict[str, Path]) -> None:
    want = direct_reference(
        fixtures["policy"], fixtures["sft"], ROWS, gamma=None, temperature=TEMPERATURE
    )
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    assert got["tempered/entropy"] == pytest.approx(want["entropy"], rel=1e-5)


@pytest.mark.usefixtures("registered")
def test_focal_first_step_equals_transformers(fixtures, tmp_path):
    """The focal objective, registered by name: two micro-batches of two packed rows,
    Megatron's loss, ``focal/p`` and gradient norm equal transformers' on the rows'
    conversations one by one."""
    argv = run_argv(fixtures, tmp_path / "run", "--objective", "focal", "--focal-gamma", "2")
    check_focal(first_step(argv), fixtures)


@pytest.mark.usefixtures("registered")
def test_tempered_first_step_equals_transformers(fixtures, tmp_path):
    """An objective at a temperature that reads the entropy: the log-probabilities come
    from the logits divided by the temperature, the entropy is the whole distribution's."""
    argv = run_argv(
        fixtures, tmp_path / "run", "--objective", "tempered",
        "--tempered-temperature", str(TEMPERATURE),
    )  # fmt: skip
    check_tempered(first_step(argv), fixtures)


def test_focal_from_its_file_first_step_equals_transformers(fixtures, tmp_path):
    """The focal objective named by its file on the command line, not registered."""
    argv = run_argv(
        fixtures, tmp_path / "run", "--objective", f"{FOCAL_FILE}:FOCAL", "--focal-gamma", "2"
    )
    check_focal(first_step(argv), fixtures)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "name", "flags", "check"),
    [
        (FOCAL_FILE, "FOCAL", ("--focal-gamma", "2"), check_focal),
        (TEMPERED_FILE, "TEMPERED", ("--tempered-temperature", str(TEMPERATURE)), check_tempered),
    ],
    ids=["focal", "tempered"],
)
def test_first_step_under_tensor_parallel_2_equals_transformers(
    fixtures, tmp_path, path, name, flags, check
):
    """The same four rows on two gloo ranks under tensor parallel 2 (two micro-batches):
    each rank holds half of the vocabulary's logits; Megatron's vocab-parallel cross
    entropy gives the log-probabilities, the entropy is reduced over both halves."""
    from support.torchrun import torchrun

    objective = declared(path, name).name
    argv = run_argv(fixtures, tmp_path / "run", "--objective", objective, "--tp", "2", *flags)
    out = tmp_path / "metrics.json"
    worker = Path(__file__).with_name("objective_worker.py")
    torchrun(worker, str(out), f"{path}:{name}", str(RECIPE), *argv)
    check(json.loads(out.read_text())["1"], fixtures)


@pytest.mark.slow
def test_focal_from_its_file_under_tensor_parallel_2_equals_transformers(fixtures, tmp_path):
    """The focal objective named by its file, under tensor parallel 2."""
    from support.torchrun import torchrun

    argv = run_argv(
        fixtures, tmp_path / "run", "--objective", f"{FOCAL_FILE}:FOCAL", "--focal-gamma", "2",
        "--tp", "2",
    )  # fmt: skip
    out = tmp_path / "metrics.json"
    torchrun(Path(__file__).with_name("posttrain_worker.py"), str(out), str(RECIPE), *argv)
    check_focal(json.loads(out.read_text())["1"], fixtures)
