"""Train 3 steps of a Megatron recipe with a ``ModelStateProbe`` and write what it saw
as JSON (rank 0): ``torchrun ... model_state_worker.py OUT RECIPE ARGS...``, or
``probe_run(OUT, RECIPE, ARGS)`` in the test's own process.

The probe, through ``backend.model_state()`` only:
- step 1: each parameter's gradient norm before clipping (counted pieces' squares summed
  over ranks), and the step's global batch (to recompute in ``transformers``);
- before step 2: freezes layer 0 and the embedding, and sets the learning rate;
- after step 3: whether every frozen piece is bit-identical to its value after step 1 (on
  every rank, also the optimizer's state for it) and every other piece changed;
- the learning rate each step used (the backend's logged ``lr``);
- at step 4 of a resumed run (with a ``Freeze`` callback): frozen pieces as loaded, the
  rest trained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from baton.core.callback import Callback
from baton.core.cli.recipe import build_driver

FROZEN = ["model.embed_tokens.weight", "model.layers.0.*"]
SET_LR = 1.25e-3


class ModelStateProbe(Callback):
    def __init__(self) -> None:
        self.norms: dict[str, float] = {}
        self.batch: dict[str, list[Any]] = {}
        self.lrs: list[float] = []
        self.after_first: dict[str, torch.Tensor] = {}
        self.optimizer_after_first: dict[int, list[torch.Tensor]] = {}
        self.checks: dict[str, bool] = {}
        self._grads: dict[str, torch.Tensor] | None = None
        self.rank = 0

    def requires(self) -> frozenset[Any]:
        return frozenset({"model_state"})

    def on_setup(self, driver: Any) -> None:
        state = driver.backend.model_state()
        state.watch_gradients(self._watch)
        self.rank = driver.backend.rank
        stream = driver.backend.train_streams[0]
        samples = [stream.dataset[i] for i in range(driver.backend.config.global_batch_size)]
        self.batch = {
            key: torch.stack([torch.as_tensor(s[key]) for s in samples]).tolist()
            for key in ("tokens", "labels", "loss_mask")
        }

    def on_train_start(self, driver: Any) -> None:
        self.at_start = {p.name: p.value.clone() for p in driver.backend.model_state().parameters()}

    def _watch(self, grads: Any) -> None:
        if self._grads is None:
            self._grads = {name: grad.clone() for name, grad in grads.items()}

    def on_step_start(self, driver: Any) -> None:
        if driver.step == 1:
            state = driver.backend.model_state()
            self.checks["fused_part_refused"] = _refused(state)
            frozen = state.freeze(FROZEN)
            self.checks["froze_layer0_and_embedding"] = bool(frozen) and all(
                n == "model.embed_tokens.weight" or n.startswith("model.layers.0.") for n in frozen
            )
            state.set_hyperparameter("lr", SET_LR)
            groups = state.optimizer_groups()
            self.checks["groups_report_set_lr"] = len(groups) > 1 and all(
                g.lr == SET_LR and g.names for g in groups
            )

    def on_step_end(self, driver: Any, output: Any) -> None:
        state = driver.backend.model_state()
        self.lrs.append(float(output.metrics["lr"]))
        if driver.step == 1:
            assert self._grads is not None
            counted = {p.name for p in state.parameters() if p.counted}
            squares = {
                name: (grad.double() ** 2).sum() for name, grad in self._grads.items()
                if name in counted
            }  # fmt: skip
            self.norms = {k: v**0.5 for k, v in state.fetch(state.sum_over_ranks(squares)).items()}
            self.after_first = {p.name: p.value.clone() for p in state.parameters()}
            self.optimizer_after_first = _optimizer_state(driver.backend.optimizer)
        if driver.step == 4:  # a resumed run: the Freeze callback froze again
            pieces = state.parameters()
            self.checks["resumed_frozen_bitwise_others_trained"] = all(
                torch.equal(p.value, self.at_start[p.name]) == p.frozen for p in pieces
            ) and any(p.frozen for p in pieces)
        if driver.step == 3:
            pieces = state.parameters()
            frozen = [p for p in pieces if p.frozen]
            moving = [p for p in pieces if not p.frozen]
            same = all(torch.equal(p.value, self.after_first[p.name]) for p in frozen)
            moved = all(not torch.equal(p.value, self.after_first[p.name]) for p in moving)
            before, after = self.optimizer_after_first, _optimizer_state(driver.backend.optimizer)
            frozen_ids = _frozen_main_ids(state, driver.backend.optimizer, frozen)
            kept = all(
                all(torch.equal(a, b) for a, b in zip(before[key], after[key], strict=True))
                for key in frozen_ids
                if key in before
            )
            # every rank: frozen unchanged, others moved; over the ranks: some frozen
            ok = torch.tensor([float(same and kept and moved)])
            count = torch.tensor([float(len(frozen))])
            if torch.distributed.is_initialized():
                torch.distributed.all_reduce(ok, op=torch.distributed.ReduceOp.MIN)
                torch.distributed.all_reduce(count)
            self.checks["frozen_bitwise_others_trained"] = ok.item() == 1.0 and count.item() > 0


def _refused(state: Any) -> bool:
    try:
        state.freeze("model.layers.0.self_attn.q_proj.weight")
    except ValueError as error:
        return "k_proj" in str(error)
    return False


def _optimizer_state(optimizer: Any) -> dict[int, list[torch.Tensor]]:
    """Each torch optimizer parameter (fp32 main copy or shard) and its state tensors
    (Adam moments; not the step count, common to all parameters in Megatron), copied."""
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    parts = optimizer.chained_optimizers if isinstance(optimizer, ChainedOptimizer) else [optimizer]
    out = {}
    for part in parts:
        for group in part.optimizer.param_groups:
            for param in group["params"]:
                state = part.optimizer.state.get(param, {})
                values = [
                    torch.as_tensor(value).clone()
                    for key, value in sorted(state.items())
                    if key != "step"
                ]
                out[id(param)] = [*values, param.detach().clone()]
    return out


def _frozen_main_ids(state: Any, optimizer: Any, frozen: list[Any]) -> set[int]:
    """The optimizer's parameters (fp32 copies or shards) that the frozen pieces' model
    parameters have."""
    from baton.backends.megatron.frozen_grads import optimizer_pairs

    names = {p.name for p in frozen}
    params = {id(entry.parameter) for entry in state.entries if entry.name in names}
    return {id(main) for model, main in optimizer_pairs(optimizer) if id(model) in params}


def probe_run(out: Path, recipe: str, args: list[str], *callbacks: Callback) -> None:
    driver = build_driver(recipe, args)
    probe = ModelStateProbe()
    driver.callbacks.extend([*callbacks, probe])
    driver.fit()
    if probe.rank == 0:
        schedule = driver.backend.config
        out.write_text(
            json.dumps(
                {
                    "norms": probe.norms,
                    "batch": probe.batch,
                    "lrs": probe.lrs,
                    "checks": probe.checks,
                    "warmup": schedule.warmup_steps,
                }
            )
        )


if __name__ == "__main__":
    probe_run(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
