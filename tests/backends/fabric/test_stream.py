"""The training data stream's position: a counted position replays the order exactly,
also when the loader draws its shuffle from its own ``torch.Generator``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from baton.backends.fabric.stream import LoaderStream, order_generators
from baton.core.backend import DataExhausted


def take(stream: LoaderStream, count: int) -> list[list[int]]:
    return [stream.next()[0].tolist() for _ in range(count)]


def numbers(count: int) -> TensorDataset:
    return TensorDataset(torch.arange(count))


def loader_with_own_generator() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(3)
    return DataLoader(numbers(12), batch_size=2, shuffle=True, generator=generator)


def test_rollback_in_the_same_process_replays_a_loader_generators_order() -> None:
    """Go back to a position taken mid-epoch (the generator has moved on since, and on
    into the next epoch): the same batches come again, in both epochs."""
    stream = LoaderStream(loader_with_own_generator())
    take(stream, 2)
    state = stream.state_dict()
    after = take(stream, 10)  # the rest of epoch 0 and most of epoch 1
    stream.load_state_dict(state)
    assert take(stream, 10) == after


def test_resume_in_a_fresh_stream_continues_a_later_epoch() -> None:
    """A position in epoch 1 restored into a new loader (its generator freshly seeded)
    continues with epoch 1's order, not epoch 0's."""
    stream = LoaderStream(loader_with_own_generator())
    take(stream, 8)  # epoch 0 (6 batches) and 2 of epoch 1
    state = stream.state_dict()
    after = take(stream, 6)
    fresh = LoaderStream(loader_with_own_generator())
    fresh.load_state_dict(state)
    assert take(fresh, 6) == after


def test_a_position_between_epochs_keeps_the_next_epochs_order() -> None:
    """Saved after an epoch ended and before the next started: the next epoch's order
    comes from the generator as it was then."""
    stream = LoaderStream(loader_with_own_generator(), on_epoch_end="stop")
    take(stream, 6)
    with pytest.raises(DataExhausted):
        stream.next()
    state = stream.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0) and "generators" in state
    after = take(stream, 4)
    fresh = LoaderStream(loader_with_own_generator(), on_epoch_end="stop")
    fresh.load_state_dict(state)
    assert take(fresh, 4) == after


def test_order_generators_follow_samplers_and_each_generator_once() -> None:
    own = torch.Generator().manual_seed(1)
    sampler = RandomSampler(numbers(8), generator=own)
    assert order_generators(DataLoader(numbers(8), sampler=sampler)) == [own]
    shared = torch.Generator().manual_seed(2)
    assert order_generators(DataLoader(numbers(8), shuffle=True, generator=shared)) == [shared]
    assert order_generators(DataLoader(numbers(8))) == []
    assert order_generators([[1], [2]]) == []
