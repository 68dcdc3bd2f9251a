"""Freezing inside Megatron-Core's optimizer: the parameters its optimizer steps (fp32
main copies, or their data-parallel shards) paired with the model's, and the one place
frozen ones lose their gradient.

Megatron's ``optimizer.step()`` first runs ``prepare_grads()`` (it points each main
parameter's ``grad`` at the reduced ``main_grad``, copies it into an fp32 main copy, or
slices this rank's shard of it), then clips and calls the torch optimizer. After
``prepare_grads`` the main parameters of frozen model parameters get ``grad = None``:
the clipping norm leaves them out and the torch optimizer skips them, so neither the
weights, the fp32 main copies nor the Adam moments change.

Megatron-Core keeps one step count for all parameters (its checkpoint refuses differing
ones), so after each torch optimizer step a frozen parameter's ``step`` is set to the
others' (its moments created as zeros, as Adam starts them, if it never stepped): after
unfreezing, its bias correction is the run's.

Example::

    dropper = FrozenGradients(optimizer)     # wraps optimizer.prepare_grads once
    dropper.frozen = {id(param) for param in frozen_params}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def optimizer_parts(optimizer: Any) -> list[Any]:
    """The Megatron optimizers a (possibly chained) optimizer steps."""
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    return optimizer.chained_optimizers if isinstance(optimizer, ChainedOptimizer) else [optimizer]


def optimizer_pairs(optimizer: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(model parameter, the parameter the torch optimizer steps for it)`` for every
    parameter of ``optimizer`` (a chained optimizer's parts in order)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    for part in optimizer_parts(optimizer):
        if isinstance(part, DistributedOptimizer):
            model = [*part.model_float16_groups, *part.model_fp32_groups]
            main = [*part.shard_fp32_from_float16_groups, *part.shard_fp32_groups]
        elif isinstance(part, Float16OptimizerWithFloat16Params):
            model = [*part.float16_groups, *part.fp32_from_fp32_groups]
            main = [*part.fp32_from_float16_groups, *part.fp32_from_fp32_groups]
        else:  # FP32Optimizer: the torch optimizer steps the model's parameters
            groups = part.optimizer.param_groups if part.optimizer is not None else []
            model = main = [group["params"] for group in groups]
        for model_group, main_group in zip(model, main, strict=True):
            yield from zip(model_group, main_group, strict=True)


class FrozenGradients:
    """Wraps ``optimizer.prepare_grads`` (on this optimizer object only) so the main
    parameters of the model parameters in ``frozen`` (by ``id``) have no gradient when
    the optimizer clips and steps."""

    def __init__(self, optimizer: Any) -> None:
        self.frozen: set[int] = set()
        self._mains: dict[int, list[torch.Tensor]] = {}
        for model, main in optimizer_pairs(optimizer):
            self._mains.setdefault(id(model), []).append(main)
        original = optimizer.prepare_grads

        def prepare_grads() -> bool:
            found_inf = original()
            for key in self.frozen:
                for main in self._mains.get(key, ()):
                    main.grad = None
            return found_inf

        optimizer.prepare_grads = prepare_grads
        for part in optimizer_parts(optimizer):
            if part.optimizer is not None:
                part.optimizer.register_step_post_hook(self._common_step)

    def _frozen_mains(self) -> Iterator[torch.Tensor]:
        for key in self.frozen:
            yield from self._mains.get(key, ())

    def _common_step(self, inner: torch.optim.Optimizer, *_: Any) -> None:
        """Frozen parameters' optimizer state keeps the step count the others reached."""
        mains = {id(main) for main in self._frozen_mains()}
        stepped = [
            p for group in inner.param_groups for p in group["params"]
            if id(p) not in mains and p in inner.state
        ]  # fmt: skip
        if not stepped:
            return
        reference = inner.state[stepped[0]]
        for group in inner.param_groups:
            for main in group["params"]:
                if id(main) in mains:
                    inner.state[main] = _state_like(reference, main, inner.state.get(main))


def _state_like(reference: dict[str, Any], main: torch.Tensor, own: Any) -> dict[str, Any]:
    """``main``'s own state (zeros where it has none) with ``reference``'s step."""
    state = dict(own) if own else {}
    for key, value in reference.items():
        if key == "step":
            state[key] = value.clone() if isinstance(value, torch.Tensor) else value
        elif key not in state:
            if isinstance(value, torch.Tensor):  # a moment (like the parameter) or a scalar
                state[key] = torch.zeros_like(main) if value.dim() else value.clone()
            else:
                state[key] = value
    return state
