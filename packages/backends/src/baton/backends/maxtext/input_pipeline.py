"""MaxText's own input pipelines on local data: the overrides for a data path and a tokenizer.

baton's byte stream is the zero-setup default. Given a tokenizer directory and a data path,
MaxText reads the data itself, as its own users run it:

* a prepared dataset (``baton data prepare``: Megatron's ``PREFIX.bin`` + ``PREFIX.idx``)
  or a blend of them (``"0.7 data/web 0.3 data/code"``, or MaxText's own
  ``"data/web,0.7;data/code,0.3"``): ``dataset_type=grain`` with ``grain_file_type=mmap``;
  the end-of-document id comes from the tokenizer;
* local JSON Lines or Parquet files (``a.jsonl,b.jsonl``): ``dataset_type=hf`` with
  ``hf_path=json|parquet`` and ``hf_train_files``, tokenized on the fly by MaxText with
  ``tokenizer_type=huggingface`` from the tokenizer directory.

Everything is checked before MaxText starts: the tokenizer loads, its vocabulary fits the
model's ``vocab_size`` (both numbers named), every prefix has its ``.bin`` and ``.idx``, and
the data was prepared with this tokenizer (fingerprints named). No jax import here.

Example::

    overrides = native_data_overrides("data/corpus", "runs/tok", vocab_size=1024)
    # {'dataset_type': 'grain', 'grain_file_type': 'mmap', 'grain_train_files': '/abs/data/corpus',
    #  'mmap_eod_id': 0, 'tokenizer_type': 'huggingface', 'tokenizer_path': '/abs/runs/tok', ...}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from baton.core.objectives.pretrain import PRETRAIN
from baton.data import (
    DataError,
    PreparedDataset,
    check_model_vocab,
    check_tokenizer,
    fingerprint_file,
    load_tokenizer,
    parse_blend,
)
from baton.data.packed import check_objective

#: file suffixes MaxText's Hugging Face pipeline reads, and the ``hf_path`` builder for each
HF_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}

#: the dataset types the baton backend drives (``synthetic`` means baton's byte stream)
DATASET_TYPES = ("synthetic", "grain", "hf")


def is_hf_files(data_path: str) -> bool:
    """Whether ``data_path`` is a comma list of local JSON/Parquet files."""
    parts = [p.strip() for p in data_path.split(",") if p.strip()]
    return bool(parts) and all(Path(p).suffix.lower() in HF_BUILDERS for p in parts)


def maxtext_mixture(data_path: str) -> tuple[list[str], list[float] | None]:
    """Prefixes and weights from baton's blend or MaxText's ``path,w;path,w`` mixture."""
    if ";" in data_path or ("," in data_path and not data_path.strip().endswith(",")):
        prefixes, weights = [], []
        for item in data_path.split(";"):
            path, sep, weight = item.strip().rpartition(",")
            try:
                value = float(weight)
            except ValueError:
                value = -1.0
            if not sep or not path or value <= 0:
                raise DataError(
                    f"mixture {data_path!r} does not parse: write 'PREFIX_A,0.7;PREFIX_B,0.3' "
                    "or '0.7 PREFIX_A 0.3 PREFIX_B', each weight a positive number"
                )
            prefixes.append(path.strip())
            weights.append(value)
        return prefixes, weights
    blend = parse_blend(data_path)
    return list(blend.prefixes), None if blend.weights is None else list(blend.weights)


def native_data_overrides(
    data_path: str, tokenizer: str | Path | None, vocab_size: int | None
) -> dict[str, Any]:
    """MaxText overrides that make MaxText read ``data_path`` with its own pipeline."""
    if not tokenizer:
        raise DataError(
            f"data path {data_path!r} is tokenized data: pass the tokenizer directory too "
            "(--tokenizer DIR; `baton data tokenizer --output DIR` makes one)"
        )
    info = load_tokenizer(tokenizer)
    if vocab_size is not None:
        check_model_vocab(info, int(vocab_size))
    common = {
        "tokenizer_type": "huggingface",
        "tokenizer_path": str(info.path.resolve()),
    }
    if is_hf_files(data_path):
        files = [Path(p.strip()) for p in data_path.split(",") if p.strip()]
        builders = {HF_BUILDERS[f.suffix.lower()] for f in files}
        if len(builders) > 1:
            raise DataError(
                f"data files {data_path!r} mix JSON and Parquet; MaxText's Hugging Face "
                "pipeline reads one format per run"
            )
        for file in files:
            if not file.is_file():
                raise DataError(f"data file {file} does not exist; pass local JSON/Parquet files")
        return common | {
            "dataset_type": "hf",
            "hf_path": builders.pop(),
            "hf_train_files": ",".join(str(f.resolve()) for f in files),
        }
    prefixes, weights = maxtext_mixture(data_path)
    resolved = []
    for prefix in prefixes:
        # MaxText's pipelines read text, as pretraining does: other data is refused
        check_objective(prefix, PRETRAIN.name)
        prepared = PreparedDataset(prefix)  # names a missing .idx/.bin or a truncated file
        check_tokenizer(prepared.prefix, info)  # names both fingerprints
        resolved.append(str(Path(prepared.prefix).resolve()))
    if weights is None and len(resolved) > 1:
        weights = [1.0] * len(resolved)
    files = (
        resolved[0]
        if weights is None
        else ";".join(f"{p},{w:g}" for p, w in zip(resolved, weights, strict=True))
    )
    return common | {
        "dataset_type": "grain",
        "grain_file_type": "mmap",
        "grain_train_files": files,
        "mmap_eod_id": info.eod_id,
    }


def native_data_fingerprint(hparams: Any) -> str:
    """A short hash of what a MaxText pipeline reads: file names and sizes, the tokenizer.

    A resume on other data or another tokenizer is refused with it.
    """
    dataset_type = str(getattr(hparams.dataset_type, "value", hparams.dataset_type))
    if dataset_type == "grain":
        files = [
            item.rpartition(",")[0] if ";" in str(hparams.grain_train_files) else item
            for item in str(hparams.grain_train_files).split(";")
        ]
        paths = [Path(f + suffix) for f in files for suffix in (".bin", ".idx")]
    else:
        paths = [Path(f) for f in str(hparams.hf_train_files).split(",") if f]
    tokenizer = Path(str(hparams.tokenizer_path)) / "tokenizer.json"
    facts = {
        "type": dataset_type,
        "files": [(p.name, p.stat().st_size if p.exists() else None) for p in paths],
        "tokenizer": fingerprint_file(tokenizer) if tokenizer.is_file() else None,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
