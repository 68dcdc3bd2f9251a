"""Bring your own model: any nn.Module, optimizer and data through the Fabric backend."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from baton.backends.fabric import FabricBackend, FabricConfig
from baton.backends.fabric.step import BatchError
from baton.core import Callback, Driver
from baton.core.cli.recipe import build_driver
from support.docs_examples import docs_example

ROOT = Path(__file__).resolve().parents[3]


class Record(Callback):
    """Every step's loss (fetched on each step: log_every=1) and every eval."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}
        self.evals: list[dict[str, float]] = []
        self.tokens: list[int] = []

    def on_step_end(self, driver, output):
        self.tokens.append(output.tokens)

    def on_log(self, driver, metrics):
        if "loss" in metrics:
            self.losses[driver.step] = metrics["loss"]

    def on_eval_end(self, driver, metrics):
        self.evals.append(metrics)


class SaveAt(Callback):
    def __init__(self, step: int) -> None:
        self.at = step

    def on_step_end(self, driver, output):
        if driver.step == self.at:
            driver.control.request_save("test", all_ranks=True)


def regression_batches(n: int = 6, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A plain list of (x, y) batches: re-iterable, no state_dict."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(n)]


def regression(data, **config) -> FabricBackend:
    torch.manual_seed(0)
    return FabricBackend(
        model=nn.Linear(4, 1),
        optimizer=lambda model: torch.optim.SGD(model.parameters(), lr=0.05),
        data=data,
        loss_fn=lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1]),
        config=FabricConfig(accelerator="cpu", **config),
    )


def readme_example(name: str) -> str:
    return docs_example(name)


def test_readme_bring_your_own_example_trains(tmp_path, monkeypatch, capsys):
    """Copied as is, the example prints the loss, saves checkpoints and resumes from them
    with --resume auto."""
    code = readme_example("bring-your-own")
    assert len(code.strip().splitlines()) < 25
    (tmp_path / "sine.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    driver = build_driver(tmp_path / "sine.py", ["--max-steps", "100"])
    record = Record()
    driver.callbacks.append(record)
    driver.options = driver.options.replace(eval_every=50)
    result = driver.fit()
    assert result.step == 100
    first, last = record.losses[20], record.losses[100]
    assert last < 0.5 * first, record.losses
    assert 0 < record.evals[-1]["eval/loss"] < first
    assert result.samples == 100 * 64
    out = capsys.readouterr().out
    assert "step    100 | loss " in out and "eval    100 | eval/loss " in out
    checkpoints = tmp_path / "runs" / "sine" / "checkpoints"
    assert (checkpoints / "step_000100").is_dir()

    extend = ["--max-steps", "120", "--resume", "auto", "--allow-changed", "max_steps"]
    resumed = build_driver(tmp_path / "sine.py", extend)
    later = Record()
    resumed.callbacks.append(later)
    assert resumed.fit().step == 120
    assert min(later.losses) > 100, "--resume auto started fresh"


def test_plain_iterable_resumes_by_skipping_and_epochs_continue(tmp_path):
    """A list has no state: the consumed batches are counted and skipped on resume; at the
    end of the list the next epoch starts (6 batches, 14 steps: three epochs)."""
    data = regression_batches(6)
    full = Record()
    Driver(regression(data), [full], max_steps=14, log_every=1, run_dir=tmp_path / "a").fit()
    Driver(regression(data), [SaveAt(8)], max_steps=8, run_dir=tmp_path / "b").fit()
    resumed = Record()
    backend = regression(data)
    Driver(
        backend, [resumed], max_steps=14, log_every=1, run_dir=tmp_path / "b", resume="auto"
    ).fit()
    assert sorted(resumed.losses) == list(range(9, 15))
    assert all(resumed.losses[s] == full.losses[s] for s in range(9, 15))
    assert backend.stream.epoch == 2 and backend.stream.batches == 2
    assert full.tokens == [0] * 14  # float features: no tokens unless count_tokens says how


def test_epoch_end_stop_ends_the_run_and_saves(tmp_path):
    from baton.callbacks import Checkpoint

    backend = regression(regression_batches(5), on_epoch_end="stop", grad_accum=2)
    result = Driver(backend, [Checkpoint(every_n_steps=100)], max_steps=50, run_dir=tmp_path).fit()
    # 5 batches, 2 per step: steps 1 and 2, then the 5th batch alone cannot make step 3
    assert result.step == 2 and "end of epoch 0" in result.stop_reason
    assert (tmp_path / "checkpoints" / "step_000002").is_dir()


def test_token_hook_and_the_models_own_loss(tmp_path):
    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.out = nn.Linear(8, 16)

        def forward(self, input_ids, labels):
            logits = self.out(self.emb(input_ids))
            return {"loss": nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())}

    ids = torch.randint(0, 16, (4, 3, 10), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": b, "labels": b} for b in ids]
    record = Record()
    backend = FabricBackend(
        model=TinyLM(),
        optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
        data=data,
        eval_data=data[:2],
        count_tokens=lambda batch: int((batch["labels"] != 0).sum()),
        config=FabricConfig(accelerator="cpu", precision="bf16-mixed"),
    )
    Driver(backend, [record], max_steps=4, log_every=1, eval_every=4, run_dir=tmp_path).fit()
    assert record.tokens == [int((b != 0).sum()) for b in ids]
    assert set(record.evals[0]) == {"eval/loss"}
    assert backend.flops_per_token == 6 * sum(p.numel() for p in TinyLM().parameters())


@pytest.mark.parametrize(
    ("model", "data", "message"),
    [
        (nn.Linear(4, 1), [torch.randn(2, 4)], "not a scalar loss"),
        (nn.Linear(4, 1), [torch.randn(2, 5)], "rejected the first training batch"),
        (nn.Linear(4, 1), iter([torch.randn(2, 4)]), "one-shot iterator"),
        (nn.Linear(4, 1), [], "yielded no batch"),
    ],
    ids=["forward-returns-no-loss", "batch-rejected", "one-shot-iterator", "empty-data"],
)
def test_bad_input_is_a_clear_error(tmp_path, model, data, message):
    backend = FabricBackend(
        model=model,
        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
        data=data,
        config=FabricConfig(accelerator="cpu"),
    )
    with pytest.raises((TypeError, ValueError, BatchError), match=message):
        Driver(backend, max_steps=2, run_dir=tmp_path).fit()


def test_loss_fn_may_return_loss_and_metrics(tmp_path):
    """`loss_fn` returning `(loss, {name: value})` (the JAX backend's form) logs each
    metric under its own name, in training and evaluation; the loss is unchanged."""

    def with_metrics(model, batch):
        error = model(batch[0]) - batch[1]
        loss = (error**2).mean()
        return loss, {"mae": error.abs().mean(), "worst": error.abs().max().item()}

    data = regression_batches()
    plain, tupled = Record(), Record()
    Driver(regression(data), [plain], max_steps=4, log_every=1, run_dir=tmp_path / "a").fit()
    torch.manual_seed(0)
    backend = FabricBackend(
        model=nn.Linear(4, 1),
        optimizer=lambda model: torch.optim.SGD(model.parameters(), lr=0.05),
        data=data,
        loss_fn=with_metrics,
        eval_data=data[:2],
        config=FabricConfig(accelerator="cpu"),
    )
    seen: list[dict[str, float]] = []

    class Logs(Callback):
        def on_log(self, driver, metrics):
            seen.append(dict(metrics))

    driver = Driver(backend, [tupled, Logs()], max_steps=4, log_every=1, eval_every=4,
                    run_dir=tmp_path / "b")  # fmt: skip
    driver.fit()
    assert tupled.losses == plain.losses
    assert all(m["mae"] > 0 and m["worst"] >= m["mae"] for m in seen)
    assert {"eval/loss", "eval/mae", "eval/worst"} <= set(tupled.evals[0])
