"""A stored reference's log-probabilities on Megatron (``ReferenceUse.STORED``): each
document's log-probability sum under the reference, computed once by this engine before
training with a forward-only pass of Megatron's schedule, and stored beside the prepared
data through ``baton.backends.reference_logps`` (``PREFIX.reference-<fingerprint16>.npy``
and its ``.json``, shared by every engine), tied to the reference's fingerprint.

Which weights the reference is (``--reference``, else the starting weights
``--init-from``), their check (the policy's architecture, the data's tokenizer) and their
fingerprint are every engine's (``baton.backends.reference_model``); scoring the rows is
this engine's own part.

Example (what ``MegatronBackend`` does for an objective with a stored reference)::

    source = checked_reference(config, tokenizer_info)   # check_data: once, before building

    def scored():                                        # only when nothing is stored
        load_weights(chunks, optimizer, source)
        return compute_reference_logps(chunks, rows, config, device)

    logps = stored_or_computed(
        rows.data.prefix, reference_fingerprint(source), engine="megatron", compute=scored,
        tokenizer_fingerprint=tokenizer_info.fingerprint,
    )
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy
import torch

from baton.backends.megatron.config import MegatronConfig
from baton.backends.reference_model import check_reference, reference_source
from baton.core.errors import UsageError
from baton.data import TokenizerInfo
from baton.data.packed import PackedDataset


def checked_reference(config: MegatronConfig, tokenizer: TokenizerInfo) -> Path:
    """The reference model's directory (``reference_model.check_reference``), refused
    (``UsageError``, one line) when the run has no starting weights, or the reference is
    missing, another architecture or another tokenizer than the policy's."""
    run = config.objective
    if config.init_from is None:
        raise UsageError(
            f"--objective {run.name} starts from a model and compares it with a reference: "
            "pass --init-from (a Hugging Face directory or checkpoint)"
        )
    source = reference_source(run, config.init_from)
    assert source is not None, "reference_source falls back on --init-from"
    return check_reference(source, config.spec, tokenizer.fingerprint)


def document_logps(batch: dict[str, torch.Tensor], output: torch.Tensor) -> torch.Tensor:
    """``[b, max_documents_per_row]`` float64: per document, the sum of the
    log-probabilities of its supervised targets (minus Megatron's per-token losses)."""
    from array_api_compat import array_namespace

    from baton.core.objectives.array_math import document_sums

    mask = batch["loss_mask"].to(torch.float64)
    logps = -output.to(torch.float64).view(mask.shape) * mask
    xp = array_namespace(logps)
    return document_sums(xp, logps, batch["segments"], batch["documents"].shape[1])


def reference_logps_loss(
    batch: dict[str, torch.Tensor], output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """A forward-only pass's "loss": each document's log-probability sum (float64) beside
    its global sequence index, for ``compute_reference_logps``."""
    logps = document_logps(batch, output.detach())
    zero = torch.zeros((), device=output.device)
    return zero, torch.zeros((), dtype=torch.int), {"documents": batch["documents"], "logps": logps}


@torch.no_grad()
def compute_reference_logps(
    chunks: list[Any], rows: Any, config: MegatronConfig, device: torch.device
) -> numpy.ndarray:
    """Every sequence's log-probability sum under the weights in ``chunks`` (float64
    ``[num_sequences]``; 0 for documents of rows ``rows`` does not hold): a forward-only
    pass of Megatron's schedule over all of ``rows``, each data-parallel rank its share,
    gathered on every rank."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from baton.backends.megatron.posttrain_step import packed_forward_step
    from baton.backends.megatron.step import run_schedule
    from baton.backends.megatron.training_data import streams_over

    data: PackedDataset = rows.data
    dp = parallel_state.get_data_parallel_world_size()
    per_pass = config.micro_batch_size * dp
    streams = streams_over(rows, config, len(chunks))
    for chunk in chunks:
        chunk.eval()
    try:
        reduced = run_schedule(
            chunks, streams, config,
            num_microbatches=-(-data.num_rows // per_pass), forward_only=True,
            forward_step=partial(packed_forward_step, reference_logps_loss),
        )  # fmt: skip
    finally:
        for chunk in chunks:
            chunk.train()
    sums = torch.zeros(data.num_sequences, dtype=torch.float64, device=device)
    seen = torch.zeros(data.num_sequences, dtype=torch.float64, device=device)
    for part in reduced:  # the last pipeline stage's micro-batches
        documents = part["documents"].flatten().to(device)
        present = documents >= 0
        sums[documents[present]] = part["logps"].flatten().to(device)[present]
        seen[documents[present]] = 1.0
    for group in (parallel_state.get_pipeline_model_parallel_group(),
                  parallel_state.get_data_parallel_group()):  # fmt: skip
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(sums, group=group)
            dist.all_reduce(seen, group=group)
    ours = seen[data.sequences.start : data.sequences.stop]  # a view's rows: its documents
    if (ours == 0).any():
        raise RuntimeError(f"reference pass left {int((ours == 0).sum())} sequences unscored")
    return (sums / seen.clamp(min=1)).cpu().numpy()
