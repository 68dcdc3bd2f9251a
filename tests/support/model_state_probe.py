"""A callback that exercises a backend's ``model_state`` ability through the contract
only (no backend branch), and the transformers reference it is compared with.

``ModelStateProbe`` records, on a run of at least four steps:

- step 1: the per-layer gradient norms before clipping (``grad_norms``: sums of squares
  of the counted pieces, ``sum_over_ranks``, one ``fetch``);
- after step 1: ``freeze(frozen)`` and ``set_hyperparameter("lr", lr)``; the lr the
  optimizer groups then report (``lr_set``) and the one the backend logs at step 2;
- steps 2-3: which names the watchers saw (``watched_while_frozen``) and whether the
  frozen pieces stayed bitwise equal (``frozen_unchanged``);
- after step 3: ``unfreeze``; step 4: whether the unfrozen pieces moved (``trained_again``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from baton.core import Callback, DriverView
from baton.core.abilities import Ability

#: what the probe freezes after step 1 (Hugging Face names)
FROZEN = ["model.embed_tokens.*", "model.layers.0.*"]


#: a layer group of an HF name: model.layers.N, model.embed_tokens, model.norm, lm_head
def layer_group(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["model", "layers"] else ".".join(parts[:2])


class ModelStateProbe(Callback):
    def __init__(self, frozen: list[str], lr: float = 5e-4, prefix: str = "") -> None:
        #: what the backend's names carry before the Hugging Face name (a module's attribute)
        self.prefix = prefix
        self.frozen_patterns = [prefix + pattern for pattern in frozen]
        self.lr = lr
        self.grad_norms: dict[str, float] = {}
        self.lr_set: list[float] = []
        self.lr_logged: dict[int, float] = {}
        self.watched_while_frozen: set[str] = set()
        self.frozen_names: list[str] = []
        self.frozen_unchanged: bool | None = None
        self.trained_again: bool | None = None
        self._snapshot: dict[str, torch.Tensor] = {}
        self._step = 0

    def requires(self) -> frozenset[Ability]:
        return frozenset({"model_state"})

    def on_setup(self, driver: DriverView) -> None:
        backend = driver.backend
        self.state = backend.model_state()
        self.counted = {p.name: p.counted for p in self.state.parameters()}
        self.state.watch_gradients(self._watch)

    def on_step_start(self, driver) -> None:
        self._step = driver.step + 1

    def _watch(self, gradients: Mapping[str, Any]) -> None:
        if self._step == 1:
            squares: dict[str, Any] = {}
            for name, grad in gradients.items():
                if self.counted[name]:
                    group = layer_group(name.removeprefix(self.prefix))
                    square = (grad.float() * grad.float()).sum()
                    squares[group] = squares[group] + square if group in squares else square
            totals = self.state.fetch(self.state.sum_over_ranks(squares))
            self.grad_norms = {group: total**0.5 for group, total in totals.items()}
        elif self._step in (2, 3):
            self.watched_while_frozen |= set(gradients)

    def _pieces(self) -> dict[str, torch.Tensor]:
        return {p.name: p.value.clone() for p in self.state.parameters(self.frozen_patterns)}

    def on_step_end(self, driver, output) -> None:
        step = driver.step
        if "lr" in output.metrics:
            self.lr_logged[step] = float(output.metrics["lr"])
        if step == 1:
            self.frozen_names = self.state.freeze(self.frozen_patterns)
            self.state.set_hyperparameter("lr", self.lr)
            self.lr_set = [group.lr for group in self.state.optimizer_groups()]
            self._snapshot = self._pieces()
        elif step == 3:
            now = self._pieces()
            self.frozen_unchanged = all(torch.equal(now[k], v) for k, v in self._snapshot.items())
            self.state.unfreeze(self.frozen_patterns)
        elif step == 4:
            now = self._pieces()
            self.trained_again = any(not torch.equal(now[k], v) for k, v in self._snapshot.items())


def transformers_grad_norms(
    source: Any, batches: list[Any], loss: Callable[[Any, Any], Any] | None = None
) -> dict[str, float]:
    """Per-layer gradient norms of the mean loss over ``batches`` (one per data-parallel
    rank) of the Hugging Face model in ``source``, by torch autograd; ``loss(model, batch)``
    (default: ``model(**batch).loss``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32)
    for batch in batches:
        value = loss(model, batch) if loss is not None else model(**batch).loss
        (value / len(batches)).backward()
    squares: dict[str, float] = {}
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        group = layer_group(name)
        squares[group] = squares.get(group, 0.0) + float(parameter.grad.double().square().sum())
    return {group: total**0.5 for group, total in squares.items()}


def token_loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross entropy of ``(tokens, labels)`` (labels already shifted)."""
    logits = model(batch[0]).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[1].flatten())


def check_probe(probe: ModelStateProbe, expected: dict[str, float], lr: float = 5e-4) -> None:
    """What every backend's probe must have seen: per-layer norms within 1e-4 of
    ``expected``, the frozen pieces bitwise unchanged and not shown, then trained again,
    the lr set reported by the groups and used (logged) at the next step."""
    import pytest

    assert set(probe.grad_norms) == set(expected), (sorted(probe.grad_norms), sorted(expected))
    for group, norm in expected.items():
        assert probe.grad_norms[group] == pytest.approx(norm, rel=1e-4), group
    frozen = ("embed_tokens", ".layers.0.")
    assert probe.frozen_names and all(any(f in n for f in frozen) for n in probe.frozen_names)
    assert set(probe.lr_set) == {lr} and probe.lr_logged[2] == pytest.approx(lr)
    assert probe.watched_while_frozen and not probe.watched_while_frozen & set(probe.frozen_names)
    assert probe.frozen_unchanged is True and probe.trained_again is True
