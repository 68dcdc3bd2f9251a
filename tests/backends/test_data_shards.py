"""Every data stream refuses a rank outside its world and data too small for the ranks,
through the same checks (``baton.data.shards``)."""

from __future__ import annotations

import pytest

from baton.data import DataError
from baton.data.shards import check_enough_for_ranks, check_rank


def test_a_rank_outside_its_world_is_refused():
    check_rank(0, 1, "S")
    check_rank(3, 4, "S")
    for rank, world in ((4, 4), (-1, 4), (0, 0)):
        with pytest.raises(DataError, match=rf"^S was given data-parallel rank {rank} of {world};"):
            check_rank(rank, world, "S")


def test_too_little_data_for_the_ranks_names_what_is_missing():
    check_enough_for_ranks(2, 2, what="x", fix="y")
    with pytest.raises(DataError, match=r"^d: 1 rows, fewer than the 2 data-parallel ranks; more$"):
        check_enough_for_ranks(1, 2, what="d: 1 rows", fix="more")
    with pytest.raises(DataError, match=r"one micro-batch across data-parallel ranks \(4 x 2\)"):
        check_enough_for_ranks(7, 2, what="d", fix="more", per_rank=4)


def test_the_streams_refuse_through_the_same_checks():
    import torch
    from torch.utils.data import TensorDataset

    from baton.backends.fabric.elastic import GlobalBatches
    from baton.backends.torchtitan.data import ByteBosEosTokenizer, PackedTextDataset

    dataset = TensorDataset(torch.arange(8))
    assert GlobalBatches(dataset, batch_size=2, rank=1, world_size=2).rank == 1
    with pytest.raises(DataError, match="GlobalBatches was given data-parallel rank 2 of 2"):
        GlobalBatches(dataset, batch_size=2, rank=2, world_size=2)
    with pytest.raises(DataError, match="needs batch_size >= 1"):
        GlobalBatches(dataset, batch_size=0)
    with pytest.raises(DataError, match="PackedTextDataset was given data-parallel rank 2 of 2"):
        PackedTextDataset(["a" * 100], ByteBosEosTokenizer(), seq_len=8, dp_rank=2, dp_world_size=2)


def test_megatrons_sample_stream_needs_a_micro_batch_on_every_rank():
    from baton.backends.megatron.data import SampleStream

    stream = SampleStream(list(range(8)), micro_batch_size=4, dp_rank=1, dp_size=2)
    assert stream.dp_rank == 1
    with pytest.raises(
        DataError, match=r"dataset has 6 samples, fewer than one micro-batch .*\(4 x 2\)"
    ):
        SampleStream(list(range(6)), micro_batch_size=4, dp_rank=0, dp_size=2)
