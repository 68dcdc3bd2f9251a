"""How a batch becomes a loss in the Fabric backend: calling the model, reading its loss,
checking it, and describing a batch the model rejected.

Example::

    loss, extra = split_loss(call_model(model, batch))   # model(**batch), .loss, ...
    check_loss(loss, "training")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class BatchError(ValueError):
    """A training batch the model (or the loss function) cannot take."""


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
    returns too)."""
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
            k: v.detach() if isinstance(v, torch.Tensor) else v
            for k, v in output.items()
            if k != "loss" and isinstance(v, torch.Tensor | int | float) and _is_scalar(v)
        }
        return output["loss"], extra
    if not isinstance(output, torch.Tensor) and getattr(output, "loss", None) is not None:
        return output.loss, {}
    return output, {}


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, torch.Tensor) or value.numel() == 1


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
