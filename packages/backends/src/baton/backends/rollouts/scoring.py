"""The reference model's log-probabilities of a step's rollouts (GRPO's KL term).

A frozen ``transformers`` model (fp32, eval mode) reads the rollout rows (right-padded,
positions 0.. along each row) in micro-batches and gives, at each completion target, the
log-softmax of its logits divided by the sampling temperature: the quantity the policy's
log-probabilities are compared with (TRL's ``ref_per_token_logps``).

Example::

    from baton.backends.rollouts.scoring import ReferenceScorer

    scorer = ReferenceScorer("hf_models/sft-export", device="cpu", temperature=1.0)
    batch = batch.with_values(ref_logps=scorer.score(batch))   # [N, seq_len] float32
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from baton.backends.rollouts.hf_generator import build_causal_lm, holds_weights
from baton.core.errors import UsageError
from baton.data.rollouts import RolloutBatch


class ReferenceScorer:
    """Per-token log-probabilities of rollout rows under a frozen reference model.

    Args:
        model: the reference's Hugging Face directory (with its weights) or a
            ``transformers`` model.
        device: where the model runs.
        temperature: the sampling temperature the logits are divided by.
        micro_batch: rows per forward pass.
    """

    def __init__(
        self,
        model: str | Path | Any,
        *,
        device: str | torch.device = "cpu",
        temperature: float = 1.0,
        micro_batch: int = 8,
    ) -> None:
        self.device = torch.device(device)
        if isinstance(model, str | Path):
            if not (Path(model).is_dir() and holds_weights(Path(model))):
                raise UsageError(
                    f"reference model {model} holds no weights; pass --reference HF_DIR, a "
                    "Hugging Face model directory (an export of a checkpoint: `baton export`)"
                )
            with torch.random.fork_rng(devices=[]):  # building draws nothing from the run's RNG
                model = build_causal_lm(model, self.device)
        self.model = model
        self.temperature = temperature
        self.micro_batch = max(1, micro_batch)

    def score(self, batch: RolloutBatch) -> np.ndarray:
        """``[N, seq_len]`` float32: the reference's log-probability of each completion
        target, 0 elsewhere."""
        rows = batch.rows
        out = np.zeros(rows.targets.shape, dtype=np.float32)
        for start in range(0, batch.size, self.micro_batch):
            stop = start + self.micro_batch
            out[start:stop] = self._score_rows(
                rows.inputs[start:stop],
                rows.targets[start:stop],
                rows.positions[start:stop],
                rows.segments[start:stop],
            )
        return np.where(batch.completion_mask, out, np.float32(0.0))

    @torch.no_grad()
    def _score_rows(
        self, inputs: np.ndarray, targets: np.ndarray, positions: np.ndarray, segments: np.ndarray
    ) -> np.ndarray:
        def tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

        logits = self.model(
            input_ids=tensor(inputs),
            attention_mask=tensor((segments > 0).astype(np.int64)),
            position_ids=tensor(positions.astype(np.int64)),
        ).logits
        logps = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        picked = logps.gather(-1, tensor(targets).unsqueeze(-1)).squeeze(-1)
        return picked.cpu().numpy()
