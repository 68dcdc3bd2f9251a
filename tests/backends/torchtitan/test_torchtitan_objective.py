"""An objective TorchTitan knows only from its declaration trains through the generic
loss (``torchtitan/objective_loss.py``): the focal toy objective
(``examples/objectives/focal.py``), whose per-token loss no engine implements.

The first step's loss, gradient norm and ``focal/p`` equal ``transformers`` computing
every conversation of the step's rows on its own, unpacked, on the same weights
(``--init-from`` a tiny Hugging Face Llama), in fp32: ``-(1 - p) ** gamma * log p``
summed over the supervised targets and divided by their count.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torchtitan")

from baton.core.cli.recipe import build_driver
from support.posttrain import LoggedMetrics, posttrain_files

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "recipes" / "torchtitan_llama3_debug.py"
FOCAL_FILE = ROOT / "examples" / "objectives" / "focal.py"
SEQ, BATCH, GAMMA = 96, 2, 2.0


def focal_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("focal_example", FOCAL_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def focal_reference(
    model_dir: Path, prefix: Path, rows: range, gamma: float
) -> tuple[float, float, float]:
    """``(loss, grad_norm, focal/p)`` of ``transformers`` on each document of ``rows``
    alone: the focal loss summed over all supervised targets / their count."""
    import torch
    from transformers import AutoModelForCausalLM

    from baton.data.packed import PackedDataset

    data = PackedDataset(str(prefix))
    documents = [(tokens, mask) for row in rows for tokens, mask in data.row(row)]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    count = sum(int(mask[1:].sum()) for _, mask in documents)
    loss = torch.zeros((), dtype=torch.float64)
    p_sum = 0.0
    for tokens, mask in documents:
        ids = torch.tensor([[int(t) for t in tokens]])
        supervised = torch.tensor([bool(m) for m in mask[1:]])
        logits = model(input_ids=ids).logits[0, :-1].float()
        logps = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        p = logps.exp()
        part = -(((1 - p) ** gamma) * logps)[supervised].sum() / count
        part.backward()
        loss += part.detach().double()
        p_sum += float(p[supervised].sum())
    grads = [q.grad.double().flatten() for q in model.parameters() if q.grad is not None]
    return float(loss), float(torch.cat(grads).norm()), p_sum / count


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("titan_objective")
    return {"root": root, **posttrain_files(root, SEQ, kinds=("sft",))}


def first_step(assets: dict[str, Path], run_dir: Path, *objective: str) -> dict[str, float]:
    logged = LoggedMetrics()
    driver = build_driver(RECIPE, [
        *objective, "--data-path", str(assets["sft"]), "--tokenizer", str(assets["tokenizer"]),
        "--init-from", str(assets["policy"]), "--seq-len", str(SEQ), "--batch-size", str(BATCH),
        "--max-steps", "1", "--log-every", "1", "--save-every", "0", "--run-dir", str(run_dir),
        "--no-progress",
    ])  # fmt: skip
    assert driver is not None
    driver.callbacks.append(logged)
    driver.fit()
    return logged.metrics[1]


def check_focal_step(assets: dict[str, Path], first: dict[str, float]) -> None:
    loss, grad_norm, p = focal_reference(assets["policy"], assets["sft"], range(BATCH), GAMMA)
    assert first["loss"] == pytest.approx(loss, rel=1e-5)
    assert first["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    assert first["focal/p"] == pytest.approx(p, rel=1e-5)


def test_a_registered_objective_trains_from_its_declaration(assets, monkeypatch, tmp_path):
    """A package's objective, registered under its name (``register_objective``), its
    setting a flag of the recipe: TorchTitan's step runs its loss and its metric."""
    from baton.core.objectives import OBJECTIVES

    focal = focal_module().FOCAL
    monkeypatch.setitem(OBJECTIVES._items, focal.name, focal)  # undone after the test
    first = first_step(assets, tmp_path, "--objective", "focal", "--focal-gamma", str(GAMMA))
    check_focal_step(assets, first)


def test_the_focal_example_trains_through_the_objective_flag(assets, tmp_path):
    first = first_step(
        assets, tmp_path, "--objective", f"{FOCAL_FILE}:FOCAL", "--focal-gamma", str(GAMMA)
    )
    check_focal_step(assets, first)


def test_gamma_zero_is_the_cross_entropy_of_sft(assets, monkeypatch, tmp_path):
    """At gamma 0 the focal loss is SFT's: the generic path (log-probabilities from
    TorchTitan's ``compute_logprobs``, divided by the step's supervised tokens) gives
    TorchTitan's own cross entropy over ``global_valid_tokens``."""
    from baton.core.objectives import OBJECTIVES

    focal = focal_module().FOCAL
    monkeypatch.setitem(OBJECTIVES._items, focal.name, focal)
    generic = first_step(assets, tmp_path / "focal", "--objective", "focal", "--focal-gamma", "0")
    native = first_step(assets, tmp_path / "sft", "--objective", "sft")
    assert "focal/p" in generic and "focal/p" not in native  # the generic path, and not
    assert generic["loss"] == pytest.approx(native["loss"], rel=1e-6)
    assert generic["grad_norm"] == pytest.approx(native["grad_norm"], rel=1e-5)


def test_log_probabilities_at_a_temperature_and_the_entropy_equal_torchs():
    """What the generic loss hands an objective, against ``torch.log_softmax`` by hand:
    each label's log-probability under ``logits / temperature`` (0 at the ignore index)
    and each distribution's entropy, without gradient."""
    import torch

    from baton.backends.torchtitan.token_logps import token_logps

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=generator, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5), generator=generator)
    labels[0, 0] = labels[1, 3] = -100
    logps, entropy = token_logps(logits, labels, 0.7, entropy=True)
    by_hand = torch.log_softmax(logits.detach().double() / 0.7, dim=-1)
    picked = by_hand.gather(2, labels.clamp(min=0)[..., None])[..., 0]
    expected = torch.where(labels == -100, torch.zeros_like(picked), picked)
    torch.testing.assert_close(logps.double(), expected, rtol=1e-6, atol=1e-6)
    assert entropy is not None and not entropy.requires_grad and logps.requires_grad
    torch.testing.assert_close(
        entropy.double(), -(by_hand.exp() * by_hand).sum(-1), rtol=1e-5, atol=1e-5
    )
    assert token_logps(logits, labels, 1.0)[1] is None


def test_rows_from_a_stream_carry_their_values_beside_the_batch():
    """Values a stream of rows computes (``values.<name>``: ``[B, T]`` per token, ``[B, D]``
    per document) reach the loss with the rows, taken off the input dict before the model
    sees it, and the step's items are counted as the rows are taken (one reduction a
    step); a value the rows do not carry is absent."""
    import torch

    from baton.backends.torchtitan.row_feed import RowFeed
    from baton.backends.torchtitan.token_logps import TORCH
    from baton.core.objectives import ObjectiveRun

    run = ObjectiveRun.of("grpo", loss_type="dapo", reward=("accuracy",))
    counted: list[torch.Tensor] = []

    def count(local: torch.Tensor) -> torch.Tensor:
        counted.append(local)
        return local * 2  # as if a second rank held as many

    feed = RowFeed(run, count=count)
    labels = torch.tensor([[-100, 5, 6, -100], [-100, -100, 7, -100]])
    carried = {"old_logps": torch.rand(2, 4), "advantages": torch.tensor([[0.5], [-0.5]])}
    batch: dict[str, torch.Tensor] = {
        "input": torch.zeros(2, 4, dtype=torch.long),
        "segments": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]]),
        "documents": torch.tensor([[0], [1]]),
        **{f"values.{name}": value for name, value in carried.items()},
    }
    feed.start_step()
    feed.take(batch, labels)
    assert set(batch) == {"input"}  # what the model sees
    rows = feed.next_rows(torch.device("cpu"))
    assert rows.mask.tolist() == (labels != -100).tolist()
    assert set(rows.values) == set(carried)  # no ref_logps: beta 0
    for name, value in carried.items():
        assert torch.equal(rows.values[name], value)
    assert float(feed.global_items(torch.device("cpu"))) == 2 * 3  # dapo: completion tokens
    feed.global_items(torch.device("cpu"))
    assert len(counted) == 1
    assert float(run.items(TORCH, rows)) == 3
