"""The example backend (``examples/minimal_backend.py``) as ``docs/writing-a-backend.md``
shows it: the page's excerpts are the file's code, its run example runs, and its
model-state view is the module's own parameters."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from baton.core import Callback, Driver
from conformance.factories import ROOT
from support.docs_examples import docs_example

EXAMPLE = ROOT / "examples" / "minimal_backend.py"


@pytest.mark.parametrize(
    "excerpt",
    [
        docs_example("minimal-backend-class"),
        docs_example("minimal-backend-step"),
        docs_example("minimal-backend-abilities"),
        docs_example("minimal-backend-save"),
        docs_example("minimal-backend-load"),
        docs_example("minimal-backend-facts"),
        docs_example("minimal-backend-model-state"),
    ],
)
def test_the_page_shows_the_example_code(excerpt: str) -> None:
    source = EXAMPLE.read_text()
    assert excerpt in source or textwrap.indent(excerpt, "    ") in source, excerpt


def test_the_page_run_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(docs_example("minimal-backend-run"), "writing-a-backend.md", "exec"), namespace)
    result = namespace["result"]
    assert result.step == 20  # type: ignore[attr-defined]


class SumOfSquares(Callback):
    """At the end: the sum of squares of every parameter through ``model_state()`` and
    over the module's own ``parameters()``; and whether a frozen weight stayed put."""

    def __init__(self) -> None:
        self.view = self.module = 0.0
        self.frozen_before: torch.Tensor | None = None
        self.frozen_after: torch.Tensor | None = None

    def on_step_end(self, driver: Driver, output: object) -> None:
        if driver.step == 2:
            state = driver.backend.model_state()
            state.freeze("0.weight")
            self.frozen_before = state.parameters("0.weight")[0].value.clone()

    def on_train_end(self, driver: Driver) -> None:
        state = driver.backend.model_state()
        squares = {p.name: (p.value * p.value).sum() for p in state.parameters()}
        self.view = sum(state.fetch(state.sum_over_ranks(squares)).values())
        model = driver.backend.model  # type: ignore[attr-defined]
        self.module = float(sum((p.detach().double() ** 2).sum() for p in model.parameters()))
        self.frozen_after = state.parameters("0.weight")[0].value.clone()


def test_model_state_is_the_module_own_parameters(tmp_path: Path) -> None:
    from minimal_backend import MinimalBackend, regression_batches

    look = SumOfSquares()
    Driver(MinimalBackend(regression_batches(8)), [look], max_steps=5, run_dir=tmp_path).fit()
    assert look.view == pytest.approx(look.module, rel=1e-6) and look.module > 0
    assert look.frozen_before is not None and look.frozen_after is not None
    assert torch.equal(look.frozen_before, look.frozen_after)  # frozen: bitwise unchanged
