"""Run the GPTModel of a Megatron-Core backend built by a recipe, outside a training run."""

from __future__ import annotations

from typing import Any

import torch


def megatron_outputs(
    backend: Any, tokens: torch.Tensor, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Set ``backend`` up (under baton's CPU patches where there is no GPU), run its
    single-stage GPTModel causally in eval mode on ``tokens`` and tear it down: the
    logits, or with ``labels`` Megatron's per-token losses (its own cross entropy)."""
    from baton.backends.megatron import cpu
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    try:
        backend.setup()
        model = backend.chunks[0].module.eval()
        length = tokens.shape[1]
        positions = torch.arange(length).unsqueeze(0).expand_as(tokens)
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)[None, None]
        with torch.no_grad():
            return model(tokens, positions, mask, labels=labels)
    finally:
        backend.teardown()
        recorder.undo()


def first_micro_batch(backend: Any) -> dict[str, torch.Tensor]:
    """The first micro-batch ``backend``'s training would read (set up and torn down
    under baton's CPU patches): ``tokens``, ``labels``, ``loss_mask``, ``position_ids``."""
    from baton.backends.megatron import cpu
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    try:
        backend.setup()
        return next(backend.train_streams[0])
    finally:
        backend.teardown()
        recorder.undo()
