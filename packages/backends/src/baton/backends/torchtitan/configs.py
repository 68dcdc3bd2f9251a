"""Ready ``Trainer.Config`` trees: TorchTitan's own configs with baton's offline data.

Example::

    from baton.backends.torchtitan.configs import llama3_debug

    config = llama3_debug(steps=20, seq_len=128, local_batch_size=4, seed=0)
    config.optimizer.lr = 1e-3          # it is TorchTitan's native config tree
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def llama3_debug(
    *,
    steps: int = 20,
    seq_len: int = 128,
    local_batch_size: int = 4,
    seed: int | None = 0,
    dump_folder: str = "./outputs",
    dataset_path: str | None = None,
    tokenizer: str | None = None,
    log_freq: int = 10,
) -> Any:
    """TorchTitan's ``llama3_debugmodel`` (6 layers, dim 256) on local text, sized for CPU.

    ``dataset_path`` (``.jsonl``/``.json``/``.parquet`` through TorchTitan's Hugging Face
    loader, ``.txt`` through baton's packed loader) and ``tokenizer`` (a local Hugging
    Face tokenizer directory, TorchTitan's ``HuggingFaceTokenizer``) select real data;
    without them the model trains on bytes of the Python language reference.

    Changes from TorchTitan's config, each for a reason: local data and tokenizer (no
    hub downloads; the model's 2048-entry vocabulary covers the 258 byte ids), no validator (it would read ``c4_validation``), fp32 parameters and
    no activation checkpointing (CPU), ``metrics.log_freq`` at baton's log cadence
    instead of 1 (TorchTitan's own metric logging syncs with the host when it logs),
    ``debug.seed`` for reproducible runs.
    """
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    config.dump_folder = dump_folder
    config.tokenizer, config.hf_assets_path = tokenizer_config(tokenizer)
    config.dataloader = dataloader_config(dataset_path, seed=seed or 0)
    config.training.steps = steps
    config.training.seq_len = seq_len
    config.training.local_batch_size = local_batch_size
    config.training.mixed_precision_param = "float32"
    config.activation_checkpoint = None
    config.validator.enable = False
    config.metrics.log_freq = log_freq
    config.debug.seed = seed
    return config


def set_layout(
    config: Any,
    *,
    dp_replicate: int = 1,
    dp_shard: int = -1,
    tp: int = 1,
    pp: int = 1,
    pp_schedule: str | None = None,
    ep: int = 1,
) -> Any:
    """Set TorchTitan's parallel layout on ``config.parallelism`` and return ``config``.

    ``dp_shard=-1`` gives FSDP every rank the other degrees leave; ``pp_schedule`` is one
    of TorchTitan's pipeline schedules (``1F1B``, ``GPipe``, ``Interleaved1F1B``...);
    ``ep`` shards a mixture-of-experts model's experts over that many ranks (TorchTitan
    takes them from the data-parallel and tensor-parallel ranks: ``dp_shard x tp``
    must be a multiple of it).
    The world size comes from the launcher; ``plan.parallelism_plan`` checks a layout
    against one without starting anything::

        set_layout(config, dp_shard=2, tp=2)      # FSDP x TP on 4 ranks
        set_layout(config, dp_shard=2, ep=2)      # FSDP 2, experts over both ranks
    """
    par = config.parallelism
    par.data_parallel_replicate_degree = dp_replicate
    par.data_parallel_shard_degree = dp_shard
    par.tensor_parallel_degree = tp
    par.pipeline_parallel_degree = pp
    par.expert_parallel_degree = ep
    if pp_schedule is not None:
        par.pipeline_parallel_schedule = pp_schedule
    return config


def dataloader_config(
    data_path: str | None,
    *,
    seed: int = 0,
    infinite: bool = True,
    text_key: str = "text",
    eval_split: float = 0.0,
    split: str = "train",
) -> Any:
    """The data-loader config for ``data_path``: TorchTitan's Hugging Face text loader for
    ``.jsonl``/``.json``/``.parquet`` files, ``PreparedDataLoader`` for a prepared prefix
    (``PREFIX.bin`` + ``PREFIX.idx`` from ``baton data prepare``), baton's packed loader
    for plain text (or the Python language reference when ``data_path`` is ``None``).

    ``eval_split`` holds out the last documents (records, paragraphs) for evaluation:
    ``split="train"`` reads the others, ``split="eval"`` those (all of them when
    ``eval_split`` is 0)."""
    from baton.backends.torchtitan.data import (
        HF_FORMATS,
        LocalTextDataLoader,
        register_local_dataset,
    )
    from baton.data import split_prefix

    suffix = "" if data_path is None else Path(data_path).suffix.lower()
    if (
        data_path is not None
        and suffix not in (".jsonl", ".parquet")
        and (Path(split_prefix(data_path) + ".idx").is_file())
    ):
        from baton.backends.torchtitan.prepared import PreparedDataLoader

        return PreparedDataLoader.Config(
            dataset_path=split_prefix(data_path),
            infinite=infinite,
            eval_split=eval_split,
            split=split,
        )
    if data_path is not None and suffix in HF_FORMATS:
        from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

        name = register_local_dataset(data_path, text_key, eval_split=eval_split, split=split)
        return HuggingFaceTextDataLoader.Config(
            dataset=name, dataset_path=data_path, infinite=infinite
        )
    return LocalTextDataLoader.Config(
        dataset_path=data_path, seed=seed, infinite=infinite, eval_split=eval_split, split=split
    )


def set_evaluation(
    config: Any,
    *,
    data_path: str | None,
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
    text_key: str = "text",
) -> Any:
    """Turn TorchTitan's validator (``config.validator``) on over the run's own data and
    return ``config``.

    With ``eval_data_path`` the validator reads that file or prepared prefix whole (the
    same kinds as ``data_path``); otherwise it reads the last ``eval_split`` of the
    training data's documents, and the training loader the documents before them
    (``baton.data.held_out_start``). The validator runs one full pass (``steps=-1``,
    every rank the same number of windows); its loss is the mean over the evaluated
    tokens. Nothing to evaluate on is a ``ValueError`` naming both flags::

        set_evaluation(config, data_path="data/corpus", eval_split=0.05)
        set_evaluation(config, data_path="data/corpus", eval_data_path="data/heldout")
    """
    if eval_data_path is None and not eval_split:
        raise ValueError(
            "evaluation needs held-out data: pass --eval-split F (the last documents of "
            "--data-path) or --eval-data-path (a file or prepared prefix)"
        )
    seed = int(getattr(config.dataloader, "seed", 0))
    if eval_split:  # training reads the documents before the held-out ones
        config.dataloader = dataloader_config(
            data_path, seed=seed, text_key=text_key, eval_split=eval_split
        )
    if eval_data_path is None:
        validation = dataloader_config(
            data_path, seed=seed, text_key=text_key, eval_split=eval_split, split="eval"
        )
    else:
        validation = dataloader_config(eval_data_path, seed=seed, text_key=text_key, split="eval")
    validation.infinite = False
    config.validator.dataloader = validation
    config.validator.steps = -1
    config.validator.enable = True
    return config


def tokenizer_config(tokenizer: str | None) -> tuple[Any, str]:
    """``(config.tokenizer, config.hf_assets_path)``: TorchTitan's ``HuggingFaceTokenizer``
    over a local tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json``), or
    the byte tokenizer when ``tokenizer`` is ``None``."""
    if tokenizer is None:
        from baton.backends.torchtitan.data import ByteBosEosTokenizer

        return ByteBosEosTokenizer.Config(), ""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    directory = Path(tokenizer)
    if not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"tokenizer directory {directory} has no tokenizer.json; pass a Hugging Face "
            "tokenizer directory (make one with `baton data tokenizer --output DIR`)"
        )
    return HuggingFaceTokenizer.Config(), str(directory)
