"""DPO's reference log-probabilities on Megatron: computed once by this engine before
training, stored beside the prepared data, tied to the reference's fingerprint.

The reference is ``config.reference`` (a Hugging Face directory or baton checkpoint) or,
by default, the starting weights ``config.init_from``. Its fingerprint hashes the files
of its weights (xxh3-128 of each, as checkpoint manifests do) and the model it is
built as; the values go to ``PREFIX.reference-<fingerprint16>.npy`` (float64, one sum
per sequence: the reference's log-probabilities of the document's supervised targets)
with ``PREFIX.reference-<fingerprint16>.json`` recording the reference, tokenizer, engine
and data fingerprints. Another reference has another file; a stored file whose
tokenizer or data differ from the run's is refused.

Example (what ``MegatronBackend.setup`` does for ``--objective dpo``)::

    reference = ReferenceModel.of(config, tokenizer=info)      # checked, fingerprinted
    values = reference.stored(data)                            # None: not computed yet
    if values is None:
        load_weights(chunks, optimizer, reference.path)
        values = compute_reference_logps(chunks, rows, config, device)
        reference.store(data, values)                          # rank 0
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy
import torch

from baton.backends.megatron.config import MegatronConfig
from baton.core.errors import UsageError
from baton.data import DataError, TokenizerInfo
from baton.data.packed import PackedDataset

log = logging.getLogger("baton")


def _weights_dir(path: Path) -> Path:
    """Where a reference's weights are: a checkpoint's ``backend/`` folder, else ``path``."""
    return path / "backend" if (path / "backend").is_dir() else path


def _architecture(config: MegatronConfig) -> dict[str, Any]:
    """The model the reference is built as (its spec, else the config's shape)."""
    if config.spec is not None:
        return config.spec.to_dict()
    shape = config.describe()
    return {k: v for k, v in shape.items() if k not in ("seq_len", "global_batch_size")}


def check_reference(config: MegatronConfig, tokenizer: TokenizerInfo) -> Path:
    """The reference model's directory, refused (``UsageError``, one line) when there is
    none, it is missing, or it is another architecture or tokenizer than the policy's."""
    from baton.core.model_spec import (
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


@dataclass(frozen=True)
class ReferenceModel:
    """A checked reference, its fingerprint, and where its values go beside the data."""

    path: Path
    fingerprint: str
    tokenizer: str

    @classmethod
    def of(cls, config: MegatronConfig, tokenizer: TokenizerInfo) -> ReferenceModel:
        from baton.core.checkpointing import manifest

        path = check_reference(config, tokenizer)
        facts = {"weights": manifest(_weights_dir(path)), "model": _architecture(config)}
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode())
        return cls(path, digest.hexdigest(), tokenizer.fingerprint)

    def files(self, data: PackedDataset) -> tuple[Path, Path]:
        """``PREFIX.reference-<fingerprint16>.npy`` and its ``.json``."""
        stem = f"{data.prefix}.reference-{self.fingerprint[:16]}"
        return Path(stem + ".npy"), Path(stem + ".json")

    def record(self, data: PackedDataset) -> dict[str, Any]:
        return {
            "reference": self.fingerprint,
            "reference_path": str(self.path),
            "tokenizer": self.tokenizer,
            "engine": "megatron",
            "data": data_fingerprint(data),
        }

    def stored(self, data: PackedDataset) -> numpy.ndarray | None:
        """The stored values (``None``: not computed yet); ``DataError`` for values of
        this reference computed on other data or with another tokenizer."""
        values, facts = self.files(data)
        if not (values.is_file() and facts.is_file()):
            return None
        saved = json.loads(facts.read_text())
        expected = self.record(data)
        for key in ("tokenizer", "data"):
            if saved.get(key) != expected[key]:
                raise DataError(
                    f"{values} holds reference log-probabilities of another "
                    f"{'tokenizer' if key == 'tokenizer' else 'version of the data'}; "
                    "remove it (and its .json) to compute them again"
                )
        array = numpy.load(values)
        if array.shape != (data.num_sequences,):
            raise DataError(f"{values} has shape {array.shape}, not ({data.num_sequences},); "
                            "remove it (and its .json) to compute it again")  # fmt: skip
        return array

    def store(self, data: PackedDataset, logps: numpy.ndarray) -> None:
        """Write the values, then their record (each renamed into place)."""
        values, facts = self.files(data)
        partial = values.with_name(f"{values.stem}.partial-{os.getpid()}.npy")
        numpy.save(partial, logps.astype(numpy.float64))
        os.replace(partial, values)
        partial = facts.with_name(f"{facts.name}.partial-{os.getpid()}")
        partial.write_text(json.dumps(self.record(data), indent=2) + "\n")
        os.replace(partial, facts)
        log.info("reference log-probabilities of %s stored in %s", self.path, values)


def data_fingerprint(data: PackedDataset) -> str:
    """The prepared data's identity: its index (sequences, rows) and file sizes."""
    from baton.data import fingerprint_file

    sizes = [Path(data.prefix + suffix).stat().st_size for suffix in (".bin", ".mask.bin")]
    facts = {"idx": fingerprint_file(data.prefix + ".idx"), "sizes": sizes}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


@torch.no_grad()
def compute_reference_logps(
    chunks: list[Any], rows: Any, config: MegatronConfig, device: torch.device
) -> numpy.ndarray:
    """Every sequence's log-probability sum under the weights in ``chunks`` (float64
    ``[num_sequences]``): a forward-only pass of Megatron's schedule over all rows, each
    data-parallel rank its share, gathered on every rank."""
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
    if (seen == 0).any():
        raise RuntimeError(f"reference pass left {int((seen == 0).sum())} sequences unscored")
    return (sums / seen).cpu().numpy()
