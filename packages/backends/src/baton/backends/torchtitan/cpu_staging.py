"""Stage a state dict for an asynchronous DCP save on a thread, without stopping the loop.

DCP's ``DefaultStager`` copies a state dict into host buffers (kept from one save to
the next) on a thread of its own, while the next step runs. Each storage is copied
with ``UntypedStorage.copy_``, which holds Python's interpreter lock for the whole
copy, so on a CPU machine the training thread's Python (the rest of the save call, the
callbacks, the next step's dispatch) waits for most of the staging: measured on a
117 MB TorchTitan state, that wait was most of the time the async save blocked the loop.

``cpu_stager()`` is that ``DefaultStager`` with one change: a storage already staged
once is copied again through byte tensors, whose ``copy_`` releases the lock, so the
training thread runs while the staging thread copies. Use it where no accelerator
exists (with one, the copies are non-blocking device-to-host transfers and DCP's own
stager is the right one)::

    checkpointer.stager = cpu_stager()  # TorchTitan's CheckpointManager
    dcp.async_save(state, checkpoint_id=path, async_stager=cpu_stager())
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of ``storage``."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class LockReleasingStateDictStager(StateDictStager):
    """DCP's ``StateDictStager`` whose repeat copies release the interpreter lock.

    The first save of a storage allocates its staging buffer (shared or pinned as
    configured) and copies as DCP does; every later save copies into that buffer
    through ``Tensor.copy_``.
    """

    def _stage_untyped_storage(
        self, storage: torch.UntypedStorage, non_blocking: bool = False
    ) -> torch.UntypedStorage:
        cached = self._cached_storage_mapping.get(storage)
        if cached is None or non_blocking or cached.nbytes() != storage.nbytes():
            return super()._stage_untyped_storage(storage, non_blocking)
        with torch.no_grad():
            _as_bytes(cached).copy_(_as_bytes(storage))
        return cached


def cpu_stager(*, shared_memory: bool = True) -> DefaultStager:
    """A ``DefaultStager`` that stages on its own thread into reused host buffers
    (shared memory, for DCP's writer process, unless ``shared_memory=False``) with
    copies that let the training thread run. CPU only: no pinned memory, blocking copies.
    """
    stager = DefaultStager(
        StagingOptions(
            use_pinned_memory=False,
            use_shared_memory=shared_memory,
            use_async_staging=True,
            use_non_blocking_copy=False,
        )
    )
    stager._state_dict_stager = LockReleasingStateDictStager(
        pin_memory=False, share_memory=shared_memory
    )
    return stager
