"""The training data position: a stateful iterator (grain) is restored exactly, a plain
re-iterable is re-created and skipped; epochs restart or stop; bad sources fail clearly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from baton.backends.jax import BatchStream, DataExhausted, DataUnavailable


def numbers(n: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.full((2,), i)} for i in range(n)]


def drawn(stream: BatchStream, k: int) -> list[int]:
    return [int(stream.next()["x"][0]) for _ in range(k)]


def test_plain_iterable_position_is_recreated_and_skipped():
    stream = BatchStream(numbers(5))
    assert drawn(stream, 7) == [0, 1, 2, 3, 4, 0, 1]
    state = json.loads(json.dumps(stream.state_dict()))  # what a checkpoint stores
    assert state == {"epoch": 1, "consumed": 2}
    fresh = BatchStream(numbers(5))
    fresh.load_state_dict(state)
    assert drawn(fresh, 4) == drawn(stream, 4) == [2, 3, 4, 0]

    def factory():  # a generator function: a new generator per epoch and per resume
        yield from numbers(3)

    gen = BatchStream(factory)
    gen.load_state_dict({"epoch": 4, "consumed": 2})
    assert drawn(gen, 2) == [2, 0] and gen.epoch == 5


def test_grain_iterator_state_is_restored_exactly():
    import grain

    def loader():
        ds = grain.MapDataset.range(20).shuffle(seed=3).map(lambda i: {"x": np.full((2,), i)})
        return ds.to_iter_dataset()

    stream = BatchStream(loader)
    first = drawn(stream, 6)
    state = json.loads(json.dumps(stream.state_dict()))
    assert "iterator" in state and stream.stateful
    rest = drawn(stream, 5)
    fresh = BatchStream(loader)
    fresh.load_state_dict(state)
    assert drawn(fresh, 5) == rest
    assert sorted(first + rest) != list(range(11))  # shuffled: not a plain count


def test_end_of_data_and_bad_sources():
    stop = BatchStream(numbers(2), on_data_end="stop")
    drawn(stop, 2)
    with pytest.raises(DataExhausted, match="ran out after 2 batches of epoch 0"):
        stop.next()
    one_shot = BatchStream(iter(numbers(2)))
    drawn(one_shot, 2)
    with pytest.raises(DataUnavailable, match="one-shot iterator"):
        one_shot.next()
    with pytest.raises(ValueError, match="one-shot iterator; pass a factory"):
        BatchStream(iter(numbers(2))).load_state_dict({"epoch": 0, "consumed": 1})
    with pytest.raises(ValueError, match="only 3 batches per epoch"):
        BatchStream(numbers(3)).load_state_dict({"epoch": 0, "consumed": 5})
    with pytest.raises(TypeError, match="iterable of batches"):
        BatchStream(42)
    with pytest.raises(ValueError, match="'restart' or 'stop'"):
        BatchStream(numbers(1), on_data_end="loop")
