"""How a batch becomes a loss in the Fabric backend: calling the model, reading its loss,
checking it, and describing a batch the model rejected.

Example::

    loss, extra = split_loss(call_model(model, batch))   # model(**batch), .loss, ...
    check_loss(loss, "training")

    # a loss function's metric that is a mean over the global batch, not per micro-batch
    loss, extra = split_loss((loss, {"accuracy": WeightedMean(correct.sum(), count)}))

    losses = BatchLoss(training_step=None, loss_fn=my_loss)   # what FabricBackend uses
    loss, extra = losses.training(model, batch)   # the first batch is checked
    values = losses.evaluation(model, batch)      # {"loss": ..., **extra}, detached
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn


class BatchError(ValueError):
    """A training batch the model (or the loss function) cannot take."""


class WeightedMean(NamedTuple):
    """A metric a loss function returns as ``(total, weight)``: the step reports
    ``total / weight``, each summed over the step's micro-batches (and, under
    ``FabricBackend(mean_over=...)``, its ranks) first, so the metric is a mean over the
    global batch whatever the micro-batching (an accuracy over pairs, a clipped fraction
    over tokens)."""

    total: Any
    weight: Any

    def value(self) -> torch.Tensor:
        """``total / weight`` (0 where the weight is 0)."""
        weight = torch.as_tensor(self.weight, dtype=torch.float32)
        return torch.as_tensor(self.total, dtype=torch.float32) / weight.clamp(min=1e-12)


def resolved(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` with each ``WeightedMean`` as its value (one batch's mean)."""
    return {k: v.value() if isinstance(v, WeightedMean) else v for k, v in metrics.items()}


def call_model(model: nn.Module, batch: Any) -> Any:
    """``model(**batch)`` for a dict, ``model(*batch)`` for a tuple or list, else ``model(batch)``."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, list | tuple):
        return model(*batch)
    return model(batch)


def split_loss(output: Any) -> tuple[Any, dict[str, Any]]:
    """``(loss, other metrics)`` from a tensor, an object with ``.loss``, a dict with
    "loss", or a ``(loss, {name: value})`` pair (the form the JAX backend's ``loss_fn``
    returns too). The metrics kept are scalars and ``WeightedMean`` pairs."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], Mapping):
        loss, metrics = output
        return loss, split_loss({**metrics, "loss": loss})[1]
    if isinstance(output, Mapping):
        if "loss" not in output:
            raise ValueError(
                f"the step returned a dict without 'loss' (keys: {sorted(output)}); "
                "return the loss under 'loss'"
            )
        extra = {
            k: _detached(v)
            for k, v in output.items()
            if k != "loss"
            and (isinstance(v, WeightedMean) or isinstance(v, torch.Tensor | int | float))
            and _is_scalar(v)
        }
        return output["loss"], extra
    if not isinstance(output, torch.Tensor) and getattr(output, "loss", None) is not None:
        return output.loss, {}
    return output, {}


def _is_scalar(value: Any) -> bool:
    if isinstance(value, WeightedMean):
        return all(_is_scalar(part) for part in value)
    return not isinstance(value, torch.Tensor) or value.numel() == 1


def _detached(value: Any) -> Any:
    if isinstance(value, WeightedMean):
        return WeightedMean(*(_detached(part) for part in value))
    return value.detach() if isinstance(value, torch.Tensor) else value


def check_loss(loss: Any, phase: str, *, need_grad: bool = True) -> None:
    """A loss is a floating-point scalar tensor (attached to the graph when training)."""
    fix = (
        "return a scalar loss from the model's forward (or its output's .loss), or pass "
        "loss_fn(model, batch) -> loss or (loss, metrics) / training_step(model, batch) -> loss"
    )
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"the {phase} step produced {type(loss).__name__}, not a loss tensor; {fix}"
        )
    if loss.numel() != 1 or not torch.is_floating_point(loss):
        raise TypeError(
            f"the {phase} step produced a {loss.dtype} tensor of shape {tuple(loss.shape)}, "
            f"not a scalar loss; {fix}"
        )
    if need_grad and not loss.requires_grad:
        raise ValueError(
            f"the {phase} loss does not depend on any trainable parameter (requires_grad is "
            "False): was it computed under torch.no_grad() or from detached values?"
        )


def describe_batch(batch: Any) -> str:
    """A short description of a batch: types, shapes and dtypes."""
    if isinstance(batch, torch.Tensor):
        return f"Tensor{list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if isinstance(batch, Mapping):
        inner = ", ".join(f"{k}: {describe_batch(v)}" for k, v in list(batch.items())[:6])
        return f"dict({inner})"
    if isinstance(batch, list | tuple):
        inner = ", ".join(describe_batch(v) for v in batch[:6])
        return f"{type(batch).__name__}({inner})"
    return type(batch).__name__


StepFn = Callable[[nn.Module, Any], Any]


class BatchLoss:
    """How one batch becomes a loss (and other metrics): ``training_step(model, batch)``,
    else ``loss_fn(model, batch)``, else what the model returns for the batch
    (``call_model``), read by ``split_loss``. The first training batch is checked: a
    batch the model rejects is a ``BatchError`` describing the batch and the fix."""

    def __init__(self, training_step: StepFn | None, loss_fn: StepFn | None) -> None:
        if loss_fn is not None and training_step is not None:
            raise ValueError("pass either loss_fn or training_step, not both")
        self.training_step, self.loss_fn = training_step, loss_fn
        self._checked = False

    def __call__(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """The loss of ``batch`` and its other metrics, unchecked."""
        if self.training_step is not None:
            return split_loss(self.training_step(model, batch))
        if self.loss_fn is not None:
            return split_loss(self.loss_fn(model, batch))
        return split_loss(call_model(model, batch))

    def training(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """The training loss of ``batch`` (and lazy metrics); the first call checks both."""
        if self._checked:
            return self(model, batch)
        try:
            loss, extra = self(model, batch)
        except (TypeError, ValueError, RuntimeError, IndexError, KeyError) as error:
            raise BatchError(
                f"the model rejected the first training batch ({describe_batch(batch)}): "
                f"{error}\nmake the data yield what the model's forward takes, or pass "
                "loss_fn(model, batch) / training_step(model, batch) to say how"
            ) from error
        check_loss(loss, "training")
        self._checked = True
        return loss, extra

    def evaluation(self, model: nn.Module, batch: Any) -> dict[str, Any]:
        """``{"loss": ..., **other metrics}`` of an evaluation batch (the loss checked;
        a ``WeightedMean`` as this batch's mean)."""
        loss, extra = self(model, batch)
        check_loss(loss, "evaluation", need_grad=False)
        return {"loss": loss.detach(), **resolved(extra)}
