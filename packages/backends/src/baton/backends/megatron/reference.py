"""DPO's reference log-probabilities on Megatron: computed once by this engine before
training with a forward-only pass of Megatron's schedule, stored beside the prepared data
through ``baton.backends.reference_logps`` (``PREFIX.reference-<fingerprint16>.npy`` and
its ``.json``, shared by every engine), tied to the reference's fingerprint.

The reference is ``config.reference`` (a Hugging Face directory or baton checkpoint) or,
by default, the starting weights ``config.init_from``; it must be the policy's
architecture and use the data's tokenizer.

Example (what ``MegatronBackend.setup`` does for ``--objective dpo``)::

    path = check_reference(config, tokenizer_info)     # UsageError: none, another model

    def scored():                                      # only when nothing is stored
        load_weights(chunks, optimizer, path)
        return compute_reference_logps(chunks, rows, config, device)

    logps = stored_or_computed(
        rows.data.prefix, reference_fingerprint(path), engine="megatron", compute=scored,
        tokenizer_fingerprint=tokenizer_info.fingerprint,
    )
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from pathlib import Path
from typing import Any

import numpy
import torch

from baton.backends.megatron.config import MegatronConfig
from baton.core.checkpoints.files import native_dir
from baton.core.errors import UsageError
from baton.data import TokenizerInfo
from baton.data.packed import PackedDataset


def check_reference(config: MegatronConfig, tokenizer: TokenizerInfo) -> Path:
    """The reference model's directory, refused (``UsageError``, one line) when there is
    none, it is missing, or it is another architecture or tokenizer than the policy's."""
    from baton.core.model.spec import (
        ModelSpec,
        check_init_from,
        check_same_architecture,
        is_hf_dir,
    )
    from baton.data import fingerprint_file

    if config.init_from is None:
        raise UsageError(
            "--objective dpo starts from a model and compares it with a reference: pass "
            "--init-from (a Hugging Face directory or checkpoint)"
        )
    path = Path(config.reference or config.init_from)
    if not path.is_dir():
        raise UsageError(f"--reference {path} is not a directory: pass a Hugging Face "
                         "directory or a baton checkpoint")  # fmt: skip
    if is_hf_dir(path):
        spec = config.spec.to_dict() if config.spec is not None else None
        check_same_architecture(
            ModelSpec.from_hf(str(path)).to_dict(), spec, what=f"--reference {path}"
        )
        own = path / "tokenizer.json"
        if own.is_file() and fingerprint_file(own) != tokenizer.fingerprint:
            raise UsageError(
                f"--reference {path} has another tokenizer than the data's ({tokenizer.path}); "
                "pass a reference that uses the data's tokenizer"
            )
    else:
        check_init_from(str(path), config.spec)
    return path


def reference_fingerprint(path: Path) -> str:
    """The reference's fingerprint: a Hugging Face directory's as every engine takes it
    (``reference_logps.model_fingerprint``: its weight and config files), a checkpoint's
    from the xxh3-128 of every file of its weights (as checkpoint manifests record)."""
    from baton.backends.reference_logps import model_fingerprint
    from baton.core.checkpoints.files import manifest
    from baton.core.model.spec import is_hf_dir

    if is_hf_dir(path):
        return model_fingerprint(path)
    files = json.dumps(manifest(native_dir(path)), sort_keys=True)
    return hashlib.sha256(files.encode()).hexdigest()


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

    from baton.backends.megatron.posttrain_step import packed_forward_step, reference_logps_loss
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
