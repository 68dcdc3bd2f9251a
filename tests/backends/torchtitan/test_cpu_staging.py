"""The CPU stager used for asynchronous DCP saves: repeat saves stage the new values
into the same buffers, and a DCP checkpoint written through it reads back exactly."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from baton.backends.torchtitan.cpu_staging import LockReleasingStateDictStager, cpu_stager


def _state() -> dict:
    base = torch.arange(64, dtype=torch.float32)
    return {
        "weight": torch.randn(16, 8),
        "view": base[8:24],  # a tensor at an offset into a larger storage
        "transposed": torch.randn(4, 6).t(),  # non-contiguous
        "bf16": torch.randn(10).to(torch.bfloat16),
        "optimizer": {"step": torch.tensor(3), "exp_avg": [torch.randn(5), torch.randn(2, 2)]},
        "epoch": 7,
    }


def _flat(state: dict) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def walk(value: object) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(state)
    return found


def test_a_repeat_stage_copies_new_values_into_the_first_buffers():
    state = _state()
    stager = LockReleasingStateDictStager(pin_memory=False, share_memory=True)
    first = stager.stage(state)
    first_pointers = [t.data_ptr() for t in _flat(first)]
    for tensor in _flat(state):
        tensor.add_(1)  # the optimizer's in-place update between two saves
    expected = [t.clone() for t in _flat(state)]
    second = stager.stage(state)
    staged = _flat(second)
    assert [t.data_ptr() for t in staged] == first_pointers  # buffers reused
    for got, want in zip(staged, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
        assert got.untyped_storage().is_shared()
    assert second["epoch"] == 7
    # the staged copy is private: changing the live state leaves it alone
    state["weight"].zero_()
    assert torch.equal(second["weight"], expected[0])


def test_async_saves_through_the_cpu_stager_read_back_exactly(tmp_path):
    state = _state()
    stager = cpu_stager(shared_memory=False)
    saved = []
    try:
        for n in range(3):
            response = dcp.async_save(
                state,
                checkpoint_id=tmp_path / f"save-{n}",
                async_stager=stager,
                async_checkpointer_type=AsyncCheckpointerType.THREAD,
            )
            response.staging_completion.result()
            saved.append([t.clone() for t in _flat(state)])
            for tensor in _flat(state):
                tensor.mul_(2).add_(n)  # training goes on while the write runs
            response.upload_completion.result()
    finally:
        stager.close()
    for n, values in enumerate(saved):
        target = _state()
        for tensor in _flat(target):
            tensor.zero_()
        dcp.load(target, checkpoint_id=tmp_path / f"save-{n}")
        for got, want in zip(_flat(target), values, strict=True):
            assert torch.equal(got, want), n
