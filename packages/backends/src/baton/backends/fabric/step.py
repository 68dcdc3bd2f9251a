"""How a batch becomes a loss in the Fabric backend: calling the model, reading its loss,
checking it, and describing a batch the model rejected; and how a step's micro-batches'
losses make the step's (a mean of micro-batch means, or a mean over the global batch).

Example::

    loss, extra = split_loss(call_model(model, batch))   # model(**batch), .loss, ...
    check_loss(loss, "training")

    # a loss function's metric that is a mean over the global batch, not per micro-batch
    loss, extra = split_loss((loss, {"accuracy": WeightedMean(correct.sum(), count)}))

    losses = BatchLoss(training_step=None, loss_fn=my_loss)   # what FabricBackend uses
    loss, extra = losses.training(model, batch)   # the first batch is checked
    values = losses.evaluation(model, batch)      # {"loss": ..., **extra}, detached

    mean = MicroBatchMean(micro_batches=2)        # how a step's micro-batches add up
    for batch in TimedDraws(stream.next, 2):      # drawn as the loop reaches each
        loss, extra = losses.training(model, mean.inputs(batch))
        fabric.backward(mean.backward_of(loss))
        mean.add(loss, extra)
    loss, metrics = mean.result(fabric)           # GlobalItemMean: the global batch's mean
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
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
        """``{"loss": ..., **other metrics}`` of an evaluation batch (the loss checked; a
        ``WeightedMean`` kept as its total and weight, for a mean over every batch)."""
        loss, extra = self(model, batch)
        check_loss(loss, "evaluation", need_grad=False)
        return {"loss": loss.detach(), **extra}


class TimedDraws:
    """``count`` batches from ``draw()``, each drawn when the iteration reaches it (so a
    step that trains on each as it comes interleaves drawing and training);
    ``waited_s`` sums the time spent drawing."""

    def __init__(self, draw: Callable[[], Any], count: int) -> None:
        self.draw, self.count = draw, count
        self.waited_s = 0.0

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.count):
            started = time.perf_counter()
            batch = self.draw()
            self.waited_s += time.perf_counter() - started
            yield batch


class MicroBatchMean:
    """A step's loss as the mean of its micro-batches' losses (the default): each
    backward pass is divided by the number of micro-batches, and the other metrics are
    the last micro-batch's."""

    def __init__(self, micro_batches: int) -> None:
        self.micro_batches = micro_batches
        self._total: torch.Tensor | None = None
        self._metrics: dict[str, Any] = {}

    def inputs(self, batch: Any) -> Any:
        """What the loss is handed: the batch as it is."""
        return batch

    def backward_of(self, loss: torch.Tensor) -> torch.Tensor:
        """The value whose backward pass this micro-batch contributes."""
        return loss if self.micro_batches == 1 else loss / self.micro_batches

    def add(self, loss: torch.Tensor, extra: Mapping[str, Any]) -> None:
        detached = loss.detach()
        self._total = detached if self._total is None else self._total + detached
        self._metrics.update(resolved(extra))

    def result(self, fabric: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """The step's loss and its other metrics."""
        assert self._total is not None, "no micro-batch was added"
        total = self._total
        return (total if self.micro_batches == 1 else total / self.micro_batches), self._metrics


class GlobalItemMean:
    """A step's loss as a mean over the items of the whole global batch
    (``FabricBackend(mean_over=...)``): each batch is handed the global count under
    ``"num_items_in_batch"``, so its loss and metrics are its share of the global mean;
    the shares are added over micro-batches and ranks, and the backward pass is scaled
    so that DDP's average of the ranks' gradients is the global mean's gradient. A
    ``WeightedMean`` metric's total and weight are added apart and reported as
    ``total / weight``."""

    def __init__(self, count: torch.Tensor, world_size: int, device: torch.device) -> None:
        self.count, self.world_size, self.device = count, world_size, device
        self._shares: dict[str, torch.Tensor] = {}

    @classmethod
    def counted(
        cls, batches: list[Any], mean_over: Callable[[Any], int], fabric: Any, device: Any
    ) -> GlobalItemMean:
        """The items of ``batches`` (``mean_over`` each, on the host batches), summed
        over the ranks (one all-reduce); a global batch without items contributes
        nothing. The count goes to the device without waiting for it: a blocking copy
        would wait for the device's queued work every step."""
        items = torch.tensor(float(sum(mean_over(b) for b in batches)))
        count = items.to(device, non_blocking=True)
        if fabric.world_size > 1:
            count = fabric.all_reduce(count, reduce_op="sum")
        return cls(count.clamp(min=1.0), fabric.world_size, device)

    def inputs(self, batch: Any) -> Any:
        """What the loss is handed: the batch (a dict) with the global count."""
        return {**batch, "num_items_in_batch": self.count}

    def backward_of(self, loss: torch.Tensor) -> torch.Tensor:
        """Each share is already divided by the global count; DDP averages the ranks'
        gradients and the global mean is their sum."""
        return loss * self.world_size if self.world_size > 1 else loss

    def add(self, loss: torch.Tensor, extra: Mapping[str, Any]) -> None:
        for name, value in {"loss": loss, **extra}.items():
            value = _summable(value, self.device)
            self._shares[name] = value if name not in self._shares else self._shares[name] + value

    def result(self, fabric: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """The step's loss and its other metrics, summed over the ranks (one all-reduce)."""
        shares = self._shares
        if self.world_size > 1:  # every share in one all-reduce
            flat = torch.cat([value.reshape(-1) for value in shares.values()])
            summed = fabric.all_reduce(flat, reduce_op="sum")
            pieces = summed.split([value.numel() for value in shares.values()])
            shares = {k: p.view_as(v) for (k, v), p in zip(shares.items(), pieces, strict=True)}
        return shares["loss"], {k: _reported(v) for k, v in shares.items() if k != "loss"}


def _summable(value: Any, device: torch.device) -> torch.Tensor:
    """A micro-batch's metric as a detached float32 tensor to add over micro-batches and
    ranks: a scalar, or ``[total, weight]`` for a ``WeightedMean``. A host number goes
    to the device without waiting for the device's queued work."""
    if isinstance(value, WeightedMean):
        return torch.stack([_on_device(part, device) for part in value])
    return _on_device(value, device)


def _on_device(value: Any, device: torch.device) -> torch.Tensor:
    """``value`` (a tensor or a number) as a detached float32 tensor on ``device``."""
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return tensor.detach().to(device, non_blocking=True).float()


def _reported(summed: torch.Tensor) -> torch.Tensor:
    """What a step logs of a summed metric: itself, or ``total / weight``."""
    return summed if summed.dim() == 0 else WeightedMean(summed[0], summed[1]).value()
