"""The data a Megatron run reads: the configured data checked before anything is built,
then one training stream per model chunk and the validation split.

Example (what ``MegatronBackend.check_data`` and ``setup`` do)::

    source = open_data(config)        # PreparedSource, or None for the byte corpus
    train_streams, valid = build_data(
        config, source, chunks=len(chunks), rank=rank, world_size=world, barrier=barrier
    )

A prepared source (``baton data prepare``) gives ``GPTDataset`` splits (a
``BlendedDataset`` over a weighted blend); otherwise the mock dataset or the byte corpus
indexed once under ``config.data.cache_dir``. An objective on packed rows reads them
(``packed_data.PackedRows``); one that trains on rollouts reads each step's rollouts
(``rollout_rows.RolloutStream``, from ``rollouts``: the rollout phase's current batch),
its prepared prompts being the rollout phase's to read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from baton.backends.megatron.config import MegatronConfig
from baton.backends.megatron.data import (
    PreparedSource,
    SampleStream,
    TrainStream,
    build_gpt_datasets,
    build_indexed_dataset,
    check_split_not_empty,
    open_prepared,
)
from baton.backends.megatron.packed_data import PackedRows, check_data_objective, open_packed
from baton.backends.megatron.rollout_rows import CurrentRollouts, RolloutStream
from baton.data.packed import held_out_rows


def open_data(config: MegatronConfig) -> PreparedSource | None:
    """Open and check the configured data and tokenizer (``None``: the byte corpus):
    ``DataError`` for data that does not fit the objective (``check_data_objective``),
    a missing tokenizer or ``.idx``, a tokenizer other than the data's, one with more
    tokens than the model's vocabulary, a split share that gets no document, or packed
    rows of another ``seq_len`` (prompts, which a rollout phase reads, are checked here
    for their kind and tokenizer only)."""
    from baton.data import DataError, check_model_vocab

    check_data_objective(config)
    data = config.data
    if data.text_path is not None and not Path(data.text_path).is_file():
        raise DataError(
            f"data path {data.text_path} is neither a text file nor a prepared dataset "
            f"({data.text_path}.bin/.idx); pass a UTF-8 text file, a prefix from `baton data "
            "prepare` (or a blend), or no data path for the Python language reference"
        )
    if data.data_path is None:
        if data.tokenizer is not None:
            raise DataError(
                f"tokenizer {data.tokenizer} given without a data path: prepare the text "
                "with `baton data prepare ... --tokenizer DIR --output PREFIX` and pass "
                "the prefix (or a blend) as the data path"
            )
        return None
    if data.tokenizer is None:
        raise DataError(
            f"data path {data.data_path!r} needs the tokenizer it was prepared with: "
            "pass its Hugging Face tokenizer directory"
        )
    source = open_prepared(data.data_path, data.tokenizer)
    if config.vocab_size is not None:
        check_model_vocab(source.info, config.vocab_size)
    if not config.packed_rows:
        check_split_not_empty(source, data.split or "98,2,0")
    elif not config.rollouts:  # (prompts: the rollout phase reads them)
        held_out_rows(
            open_packed(config),
            config.objective.name,
            eval_split=data.eval_split,
            eval_data_path=data.eval_data_path,
        )  # fmt: skip  (held-out rows that do not fit are refused before anything is built)
    return source


def streams_over(dataset: Any, config: MegatronConfig, count: int) -> list[SampleStream]:
    """``count`` streams over ``dataset`` (one per model chunk: each chunk of an
    interleaved pipeline reads its own), each reading this data-parallel rank's share."""
    from megatron.core import parallel_state

    return [
        SampleStream(
            dataset,
            micro_batch_size=config.micro_batch_size,
            dp_rank=parallel_state.get_data_parallel_rank(),
            dp_size=parallel_state.get_data_parallel_world_size(),
        )
        for _ in range(count)
    ]


def build_data(
    config: MegatronConfig,
    source: PreparedSource | None,
    *,
    chunks: int,
    rank: int,
    world_size: int,
    barrier: Callable[[], None],
    rollouts: CurrentRollouts | None = None,
) -> tuple[list[TrainStream], Any]:
    """The training streams (one per model chunk) and the validation split; rank 0
    indexes the byte corpus while the others wait at ``barrier``. Packed rows (an
    objective on conversations or preference pairs) are one stream of ``PackedRows`` per
    chunk, every row trained on unless rows are held out (``data.eval_split``: the last
    rows; ``data.eval_data_path``: other data), which are then the validation rows. An
    objective on rollouts reads each step's batch from ``rollouts`` (one
    ``RolloutStream`` per chunk; nothing held out)."""
    if config.rollouts:
        if rollouts is None:
            raise ValueError(
                f"--objective {config.objective.name} trains on rollouts: give the backend "
                "the rollout phase's current batch (MegatronBackend(config, rollouts=...))"
            )
        return [*rollout_streams(config, rollouts, chunks)], None
    if config.packed_rows:
        assert source is not None, "open_data refuses post-training without prepared data"
        trained, held = held_out_rows(
            open_packed(config),
            config.objective.name,
            eval_split=config.data.eval_split,
            eval_data_path=config.data.eval_data_path,
        )
        rows = PackedRows(trained, pad_id=source.info.eod_id)
        valid = None if held is None else PackedRows(held, pad_id=source.info.eod_id)
        return [*streams_over(rows, config, chunks)], valid
    if source is not None:
        datasets = prepared_datasets(config, source, world_size)
    elif config.data.kind == "mock":
        datasets = build_gpt_datasets(None, seq_len=config.seq_len, seed=config.seed, mock=True)
    else:
        prefix = str(Path(config.data.cache_dir) / "text")
        if rank == 0:
            build_indexed_dataset(prefix, config.data.text_path)
        barrier()
        prefix = build_indexed_dataset(prefix, config.data.text_path)  # verifies the hash
        datasets = build_gpt_datasets(
            prefix, seq_len=config.seq_len, seed=config.seed, split=config.data.split or "969,30,1"
        )
    train, valid, _ = datasets
    return [*streams_over(train, config, chunks)], valid


def prepared_datasets(config: MegatronConfig, source: PreparedSource, world_size: int) -> list[Any]:
    """GPTDataset splits (a BlendedDataset over several prefixes) of prepared data."""
    sizes: list[int | None] = [None, None, None]
    if config.data.train_samples is not None or source.blend.weights is not None:
        if config.data.train_samples is None:
            raise ValueError(
                f"the weighted blend {source.blend} needs config.data.train_samples "
                "(steps x global batch size: the samples Megatron draws from the blend)"
            )
        eval_samples = (
            config.data.eval_micro_batches
            * config.micro_batch_size
            * max(1, config.data_parallel_size(world_size))
        )
        sizes = [config.data.train_samples, eval_samples, eval_samples]
    return build_gpt_datasets(
        source.blend,
        seq_len=config.seq_len,
        seed=config.seed,
        split=config.data.split or "98,2,0",
        tokenizer=source.tokenizer,
        sizes=sizes,
    )


def rollout_streams(
    config: MegatronConfig, rollouts: CurrentRollouts, count: int
) -> list[RolloutStream]:
    """``count`` streams of the step's rollouts (one per model chunk), each taking this
    data-parallel rank's share."""
    from megatron.core import parallel_state

    return [
        RolloutStream(
            rollouts,
            micro_batch_size=config.micro_batch_size,
            dp_rank=parallel_state.get_data_parallel_rank(),
            dp_size=parallel_state.get_data_parallel_world_size(),
            global_batch_size=config.global_batch_size,
        )
        for _ in range(count)
    ]
