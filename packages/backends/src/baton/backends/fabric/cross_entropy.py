"""How a ``transformers`` causal LM's cross entropy is computed on Fabric (the recipe's
``--cross-entropy auto|chunked|fused|full``), without the full float32 logits where it
can be:

- ``chunked``: the model runs with its output head replaced, for that one call, by
  ``chunked_logps`` over the decoder's last hidden states: the targets' log-probabilities
  (and the entropy where the objective reads it) a chunk of tokens at a time, so only
  one chunk's float32 logits exist at once, in the forward and in the backward. The head
  is replaced inside the model's own forward, so autocast, DDP and sharded parameters see
  the same call as on the full path. It serves SFT's loss (the sum over the supervised
  targets over ``num_items_in_batch``: ``chunked_nll_sum``, whose gradient is computed
  in the forward) and every other objective's log-probabilities (``chunked_logps``).
- ``fused``: SFT's loss by Liger's fused linear cross entropy (``liger_kernel``, CUDA
  only); the log-probabilities of the other objectives go through ``chunked``.
- ``full``: the model's logits ``[B, T, V]``, then ``transformers``' own loss (SFT) or
  ``torch_logps`` (every other objective), as before these paths existed.
- ``auto``: on CUDA, ``fused`` where ``liger_kernel`` is importable, else ``chunked``;
  on a CPU ``full`` (the chunks agree with it within 1e-6 but not to the last bit, and
  a CPU runs them no faster); a model outside the families whose head is known (Llama,
  Qwen3, Qwen3-MoE: a plain linear head, tied or not, no logit softcapping or scaling)
  falls back to ``full``. :attr:`CrossEntropy.reason` says why.

``chunked`` and ``fused`` asked for run wherever they can (``chunked`` on a CPU too).

Example::

    choice = resolve_cross_entropy("auto", config, device="cuda")
    choice.line()          # 'cross entropy: chunked (auto: liger_kernel is not installed)'
    output, logps, entropy = target_logps(model, inputs, targets, choice, temperature=0.7,
                                          entropy=True)
    loss = supervised_loss(model, inputs, labels, num_items, choice)[1]
    output = causal_lm_output(model, ids, choice)   # output.loss: next-token mean over ids
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from baton.backends.chunked_logps import IGNORE, chunked_logps, chunked_nll_sum
from baton.core.errors import UsageError

#: the values of ``--cross-entropy``
CROSS_ENTROPY_CHOICES = ("auto", "chunked", "fused", "full")
#: the model types whose output head is a plain linear projection of the last hidden
#: states (tied or not), with no softcapping or scaling of the logits
KNOWN_HEADS = ("llama", "qwen3", "qwen3_moe")


@dataclass(frozen=True)
class CrossEntropy:
    """The resolved cross-entropy path of a run and why it was chosen."""

    #: ``chunked``, ``fused`` or ``full``
    path: str
    #: why this path (``asked``, or what ``auto`` found)
    reason: str = "asked"
    #: tokens per chunk (None: ``chunked_logps.default_chunk_size`` of the vocabulary)
    chunk_size: int | None = None

    def line(self) -> str:
        """The path in a few words, for the one log line naming a run's fast paths."""
        return f"cross entropy: {self.path} ({self.reason})"

    def settings(self) -> dict[str, str]:
        """What the run records among its settings (beside the ``--cross-entropy``
        choice, the path it took here)."""
        return {"cross_entropy_path": self.path}


#: the plain path: the model's logits and ``transformers``' own loss
FULL = CrossEntropy("full")


def liger_installed() -> bool:
    """Whether Liger's kernels (``liger_kernel``) can be imported."""
    return importlib.util.find_spec("liger_kernel") is not None


def resolve_cross_entropy(
    choice: str, config: Any, *, device: str, chunk_size: int | None = None
) -> CrossEntropy:
    """The path ``--cross-entropy choice`` takes for the model of ``config`` (a
    ``transformers`` config) on ``device`` (``cuda`` or ``cpu``: the device the run
    trains on, ``fast_paths.run_device``); a bad value, or a path that cannot run here,
    is a one-line ``UsageError``."""
    if choice not in CROSS_ENTROPY_CHOICES:
        raise UsageError(
            f"--cross-entropy must be one of {', '.join(CROSS_ENTROPY_CHOICES)}, got {choice!r}"
        )
    if choice == "full":
        return FULL
    if choice == "auto" and device != "cuda":
        return CrossEntropy("full", "auto: not on cuda")
    model_type = getattr(config, "model_type", None)
    if model_type not in KNOWN_HEADS:
        if choice == "auto":
            return CrossEntropy("full", f"auto: the head of {model_type} is not known")
        raise UsageError(
            f"--cross-entropy {choice} knows the heads of {', '.join(KNOWN_HEADS)}, not "
            f"{model_type}; use --cross-entropy full (or auto)"
        )
    fused = liger_installed() and device == "cuda"
    if choice == "fused" and not fused:
        raise UsageError(
            "--cross-entropy fused needs liger_kernel and a CUDA device; use "
            "--cross-entropy chunked (or auto)"
        )
    if choice != "auto":
        return CrossEntropy(choice, chunk_size=chunk_size)
    if fused:
        return CrossEntropy("fused", "auto: liger_kernel on cuda", chunk_size)
    return CrossEntropy("chunked", "auto: liger_kernel is not installed", chunk_size)


@contextmanager
def head_replaced(
    model: Any, compute: Callable[[torch.Tensor, torch.nn.Module], torch.Tensor]
) -> Iterator[None]:
    """Within the block, ``model``'s output head returns ``compute(hidden, head)`` in
    place of its logits (what ``output.logits`` then holds)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"the model's output head is a {type(head).__name__}, not nn.Linear")
    head.forward = lambda hidden: compute(hidden, head)  # an instance attribute, for this call
    try:
        yield
    finally:
        del head.forward


def target_logps(
    model: Any,
    inputs: Mapping[str, Any],
    targets: torch.Tensor,
    cross_entropy: CrossEntropy,
    *,
    temperature: float = 1.0,
    entropy: bool = False,
) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """``(the model's output, log p(targets), entropy or None)`` of ``model(**inputs)``,
    ``[B, T]`` float32 (0 where a target is ``IGNORE``), by ``chunked_logps`` over the
    last hidden states (``output.logits`` holds the log-probabilities)."""
    held: dict[str, torch.Tensor | None] = {}

    def compute(hidden: torch.Tensor, head: torch.nn.Module) -> torch.Tensor:
        logps, held["entropy"] = chunked_logps(
            hidden, head.weight, targets, bias=head.bias, temperature=temperature,
            entropy=entropy, chunk_size=cross_entropy.chunk_size,
        )  # fmt: skip
        return logps

    with head_replaced(model, compute):
        output = model(**inputs)
    return output, output.logits, held.get("entropy")


def supervised_loss(
    model: Any,
    inputs: Mapping[str, Any],
    labels: torch.Tensor,
    num_items: torch.Tensor | int,
    cross_entropy: CrossEntropy,
) -> tuple[Any, torch.Tensor]:
    """``(the model's output, the sum of cross entropy over the supervised targets of
    labels / num_items)`` of ``model(**inputs)``: Liger's fused kernel on the ``fused``
    path, else ``chunked_nll_sum`` (``output.logits`` holds the sum)."""

    def summed(hidden: torch.Tensor, head: torch.nn.Module) -> torch.Tensor:
        if cross_entropy.path == "fused":
            return liger_summed_cross_entropy(hidden, head, labels)
        return chunked_nll_sum(
            hidden, head.weight, labels, bias=head.bias, chunk_size=cross_entropy.chunk_size
        )

    with head_replaced(model, summed):
        output = model(**inputs)
    return output, output.logits / num_items


def causal_lm_output(model: Any, ids: torch.Tensor, cross_entropy: CrossEntropy = FULL) -> Any:
    """The model's output on token rows ``ids`` with its causal-LM loss in ``loss`` (each
    token predicts the next; a MoE adds its load-balancing term, as ``transformers``
    does): the model's own loss, or on the ``chunked``/``fused`` paths the same mean
    without the full float32 logits."""
    if cross_entropy.path == "full":
        return model(input_ids=ids, labels=ids)
    targets = F.pad(ids[:, 1:], (0, 1), value=IGNORE)
    output, loss = supervised_loss(
        model, {"input_ids": ids}, targets, (targets != IGNORE).sum(), cross_entropy
    )
    if getattr(output, "aux_loss", None) is not None:  # a MoE with output_router_logits
        loss = loss + model.router_aux_loss_coef * output.aux_loss
    output.loss = loss
    return output


def liger_summed_cross_entropy(
    hidden: torch.Tensor, head: torch.nn.Module, labels: torch.Tensor
) -> torch.Tensor:
    """Liger's fused linear cross entropy of ``head(hidden)`` at ``labels``, summed over
    the supervised targets (CUDA only)."""
    from liger_kernel.transformers import (  # pyright: ignore[reportMissingImports]
        LigerFusedLinearCrossEntropyLoss,
    )

    loss_fn = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE, reduction="sum")
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = loss_fn(head.weight, flat, labels.reshape(-1), head.bias)
    return out[0] if isinstance(out, tuple) else out
