"""The targets' log-probabilities straight from a decoder's last hidden states and its
output projection, a chunk of tokens at a time: only one chunk's float32 logits exist at
once, in the forward and in the backward (which recomputes them from the hidden states
and each row's saved log-sum-exp). The full path (``torch_logps.token_logps`` over the
model's ``[B, T, V]`` logits) holds all of them in float32, and its gradient as well.

Values and gradients equal the full path's: logits are the projection in the compute
dtype (autocast's where it is on, as ``nn.Linear`` under autocast computes them), cast
to float32 and divided by the temperature; ``log p(target) = logit[target] - logsumexp``;
the entropy (where asked) is ``-sum(p * log p)`` without gradient; a target ``IGNORE``
(-100) gets 0 and no gradient. The projection's gradient is accumulated in float32.

A plain sum of the targets' cross entropy (SFT, pretraining: :func:`chunked_nll_sum`)
goes through the same chunks, and since its gradient per logit does not depend on the
other tokens, each chunk's gradient is computed in the forward while its logits exist:
the backward only scales it (one pass over the logits instead of two). The price: the
projection's float32 gradient (``[V, H]``) is held from the forward to the backward.

Example::

    hidden = model.model(input_ids=ids).last_hidden_state        # [B, T, H]
    logps, entropy = chunked_logps(hidden, model.lm_head.weight, targets,
                                   temperature=0.7, entropy=True, chunk_size=512)
    loss = chunked_nll_sum(hidden, model.lm_head.weight, labels) / num_items
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

#: the target id that marks "no target here" (as ``torch_logps.IGNORE``)
IGNORE = -100

#: the float32 logits one chunk may hold by default (bytes): 256 MiB, 441 tokens of a
#: 151,936-entry vocabulary, 2,048 of a 32,768-entry one
CHUNK_BYTES = 256 * 2**20


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per chunk whose float32 logits take :data:`CHUNK_BYTES`."""
    return max(1, CHUNK_BYTES // (4 * vocab_size))


def chunked_logps(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log p(targets), entropy or None)``, float32, shaped like ``targets``, of the
    logits ``hidden @ weight.T (+ bias)`` divided by ``temperature``; ``hidden`` is
    ``[..., H]`` and ``targets`` its leading shape. ``chunk_size``: tokens per chunk
    (default :func:`default_chunk_size`)."""
    shape = targets.shape
    size = chunk_size or default_chunk_size(weight.shape[0])
    if size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {size}")
    logps, ent = _HeadLogps.apply(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        bias,
        targets.reshape(-1),
        float(temperature),
        int(size),
        bool(entropy),
    )
    return logps.view(shape), ent.view(shape) if entropy else None


def chunked_nll_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``-sum(log p(targets))`` over the targets that are not ``IGNORE`` (a 0-d float32
    tensor): :func:`chunked_logps`'s sum, with each chunk's gradient computed in the
    forward while its logits exist (no recomputation in the backward)."""
    size = chunk_size or default_chunk_size(weight.shape[0])
    if size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {size}")
    return _HeadNllSum.apply(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        bias,
        targets.reshape(-1),
        int(size),
        torch.is_grad_enabled(),
    )


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.Linear`` would compute in here: autocast's where it is on."""
    device = tensor.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return tensor.dtype


def _in_dtype(
    dtype: torch.dtype, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The projection's operands in the compute dtype (``bias`` may be None)."""
    return hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """A chunk's float32 logits over the temperature."""
    logits = F.linear(hidden, weight, bias).float()
    return logits if temperature == 1.0 else logits.div_(temperature)


def _logit_grad(
    logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """``scale * d log p(target) / d logits = scale * (onehot(target) - softmax)``, in
    place of a chunk's ``logits`` (``scale``: each row's upstream gradient over the
    temperature, 0 where there is no target)."""
    grad = logits.sub_(lse[:, None]).exp_().mul_(-scale[:, None])
    return grad.scatter_add_(1, targets[:, None], scale[:, None])


class _Grads:
    """The gradients of a projection's input, weight and bias, a chunk at a time (the
    weight's and bias's accumulated in float32)."""

    def __init__(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        needs: tuple[bool, ...],
    ) -> None:
        as_float = {"dtype": torch.float32, "device": weight.device}
        self.hidden = torch.empty_like(hidden) if needs[0] else None
        self.weight = torch.zeros(weight.shape, **as_float) if needs[1] else None
        self.bias = torch.zeros(bias.shape, **as_float) if bias is not None and needs[2] else None
        self.dtypes = (weight.dtype, None if bias is None else bias.dtype)

    def add(self, part: slice, grad: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> None:
        """Add a chunk's logit gradient ``grad`` (rows ``part`` of the input ``h``)."""
        if self.hidden is not None:
            self.hidden[part] = grad @ w
        if self.weight is not None:
            self.weight.add_(grad.t() @ h[part])
        if self.bias is not None:
            self.bias.add_(grad.sum(dim=0))

    def result(self, scale: torch.Tensor | None = None) -> tuple[torch.Tensor | None, ...]:
        """``(input, weight, bias)`` gradients, each times ``scale`` where given."""
        out: list[torch.Tensor | None] = []
        for grad, dtype in zip(
            (self.hidden, self.weight, self.bias), (None, *self.dtypes), strict=True
        ):
            if grad is not None:
                grad = grad if scale is None else grad * scale.to(grad.dtype)
                grad = grad if dtype is None else grad.to(dtype)
            out.append(grad)
        return tuple(out)


class _HeadLogps(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _compute_dtype(hidden)
        count = hidden.shape[0]
        logps = torch.zeros(count, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(count, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(count if entropy else 0, dtype=torch.float32, device=hidden.device)
        valid = targets != IGNORE
        safe = targets.clamp(min=0)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w, b = _in_dtype(dtype, hidden, weight, bias)
            for start in range(0, count, chunk_size):
                part = slice(start, start + chunk_size)
                logits = _chunk_logits(h[part], w, b, temperature)
                lse[part] = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, safe[part, None])[:, 0] - lse[part]
                logps[part] = torch.where(valid[part], picked, 0.0)
                if entropy:
                    logits -= lse[part, None]  # log p
                    ent[part] = -(logits.exp() * logits).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk_size, ctx.dtype = temperature, chunk_size, dtype
        ctx.mark_non_differentiable(ent)
        return logps, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logps: torch.Tensor, _grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        temperature, size, dtype = ctx.temperature, ctx.chunk_size, ctx.dtype
        scale = grad_logps.float() * (targets != IGNORE) / temperature
        safe = targets.clamp(min=0)
        grads = _Grads(hidden, weight, bias, ctx.needs_input_grad)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w, b = _in_dtype(dtype, hidden, weight, bias)
            for start in range(0, hidden.shape[0], size):
                part = slice(start, start + size)
                logits = _chunk_logits(h[part], w, b, temperature)
                grad = _logit_grad(logits, lse[part], safe[part], scale[part])
                grads.add(part, grad.to(dtype), h, w)
        return (*grads.result(), None, None, None, None)


class _HeadNllSum(torch.autograd.Function):
    """``sum(-log p(target))`` over the targets; the loss is a plain sum, so each chunk's
    gradient is known in the forward (for an upstream gradient of 1) and the backward
    only scales it: no second pass over the logits."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk_size: int,
        with_grad: bool,
    ) -> torch.Tensor:
        dtype = _compute_dtype(hidden)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        valid = targets != IGNORE
        safe = targets.clamp(min=0)
        scale = -valid.float()  # d (-log p) = -(d log p)
        needs = ctx.needs_input_grad[:3] if with_grad else (False, False, False)
        grads = _Grads(hidden, weight, bias, needs)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w, b = _in_dtype(dtype, hidden, weight, bias)
            for start in range(0, hidden.shape[0], chunk_size):
                part = slice(start, start + chunk_size)
                logits = _chunk_logits(h[part], w, b, 1.0)
                lse = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, safe[part, None])[:, 0]
                total += ((lse - picked) * valid[part]).sum()
                if any(needs):
                    grad = _logit_grad(logits, lse, safe[part], scale[part])
                    grads.add(part, grad.to(dtype), h, w)
        ctx.grads = grads
        return total

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_total: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        return (*ctx.grads.result(grad_total), None, None, None)
