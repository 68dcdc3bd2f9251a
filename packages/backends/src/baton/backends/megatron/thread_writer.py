"""Megatron-Core's asynchronous checkpoint write on a thread instead of a forked process.

``dist_checkpointing.save(..., async_sharded_save=True)`` returns an ``AsyncRequest``:
a write function (Megatron's own ``write_preloaded_data_multithread``), its write
buckets, and the finalize functions every rank runs when all writes are done. Megatron's
``AsyncCallsQueue`` runs the write in a process forked per save (or a persistent worker,
which needs CUDA). On a CPU machine the fork alone blocked the loop ~20 ms per save and
leaned on copy-on-write for a snapshot of the state.

``ThreadCallsQueue`` is Megatron's ``AsyncCallsQueue`` (same scheduling, same
all-rank completion check, same finalize functions) whose caller runs the write on a
thread. The thread first copies the tensors of the write buckets into host buffers
kept from one save to the next (``StagingBuffers``; ``Tensor.copy_`` releases the
interpreter lock, so the next step's forward and backward run meanwhile), then writes. The training state changes only in the optimizer step, so the backend
calls ``wait_for_staging`` just before it, as TorchTitan waits for its staging copy::

    queue = ThreadCallsQueue()
    request = dist_checkpointing.save(state, path, async_sharded_save=True, async_strategy="mcore")
    queue.schedule_async_request(request)
    ...                      # forward and backward of the next step
    queue.wait_for_staging()
    optimizer.step()
    queue.maybe_finalize_async_calls(blocking=True)  # on every rank
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch
from megatron.core.dist_checkpointing.strategies.async_utils import (
    AsyncCaller,
    AsyncCallsQueue,
    AsyncRequest,
)


class StagingBuffers:
    """Copies of the write buckets' tensors, kept from one save to the next.

    A save copies each tensor into the buffer the previous save used for the same
    write item (same shape and dtype), so after the first save staging allocates
    nothing; a new item, or a changed one, gets a fresh copy. Only one write may read
    the buffers at a time (``ThreadCallsQueue`` hands them to a save only when no
    earlier write is still running).
    """

    def __init__(self) -> None:
        self._buffers: dict[Any, torch.Tensor] = {}

    def stage(self, write_buckets: list[Any]) -> list[Any]:
        """The write buckets (files and keys kept) with every tensor replaced by its
        copy: what the write reads no longer changes when the optimizer steps."""
        staged = []
        for file_name, storage_key, (bytes_data, tensor_data) in write_buckets:
            tensors = [
                (item, self._copy(item.index, tensor.detach())) for item, tensor in tensor_data
            ]
            staged.append((file_name, storage_key, (bytes_data, tensors)))
        return staged

    def _copy(self, key: Any, tensor: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(key)
        if (
            buffer is None
            or buffer.shape != tensor.shape
            or buffer.dtype != tensor.dtype
            or buffer.device != tensor.device
        ):
            buffer = self._buffers[key] = tensor.clone()
        else:
            buffer.copy_(tensor)
        return buffer


class ThreadAsyncCaller(AsyncCaller):
    """Runs one ``AsyncRequest``'s write on a thread: the staging copy, then the write."""

    def __init__(self, buffers: StagingBuffers | None = None) -> None:
        #: where the write's copies go (``None``: fresh copies, an earlier write still reads)
        self._buffers = buffers
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.staged = threading.Event()
        self.staged.set()

    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        if async_req.async_fn is None:
            return  # nothing to write on this rank
        write, kwargs = async_req.async_fn, async_req.async_fn_kwargs
        args = list(async_req.async_fn_args)
        self.staged.clear()

        def run() -> None:
            try:
                if async_req.preload_fn is not None:  # (rank, write buckets, results queue)
                    args[1] = (self._buffers or StagingBuffers()).stage(args[1])
                self.staged.set()
                write(*args, **kwargs)
            except BaseException as error:  # re-raised on the training thread
                self._error = error
            finally:
                self.staged.set()

        self._thread = threading.Thread(target=run, name="baton-megatron-save", daemon=True)
        self._thread.start()

    def writing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        alive = int(self.writing())
        done = not alive if no_dist else bool(self.sync_all_async_calls(alive))
        if done or blocking:
            self.close()
            done = True
        return done

    def close(self, abort: bool = False) -> None:
        """Wait for the write (a thread cannot be killed: ``abort`` waits too) and
        re-raise what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __del__(self) -> None:  # Megatron's base class raises here
        pass


class ThreadCallsQueue(AsyncCallsQueue):
    """Megatron's ``AsyncCallsQueue`` with every write on a thread (``ThreadAsyncCaller``).

    The write hands its results to the finalize functions through the queue
    ``filesystem_async.get_write_results_queue()`` returns: by default a queue served by a
    ``multiprocessing`` Manager, a process spawned at the first save, for a writer in
    another process. A thread needs no such queue, and it cost the first save its
    completion: the writer's ``put`` waits until the spawned server has imported torch
    to unpickle the results (seconds on a busy CPU; the checkpoint of step 25 was
    complete only when the next save began). ``in_process_results`` makes it a plain
    ``queue.Queue`` for the whole process, before the first save asks for one.
    """

    def __init__(self) -> None:
        super().__init__(persistent=False)
        self._buffers = StagingBuffers()
        in_process_results()

    def _get_async_caller(self) -> ThreadAsyncCaller:
        busy = any(
            isinstance(active.async_caller, ThreadAsyncCaller) and active.async_caller.writing()
            for active in self.async_calls
        )
        return ThreadAsyncCaller(None if busy else self._buffers)

    def wait_for_staging(self) -> None:
        """Block until every write in flight has copied the state it writes."""
        for active in self.async_calls:
            caller = active.async_caller
            if isinstance(caller, ThreadAsyncCaller):
                caller.staged.wait()

    @staticmethod
    def usable() -> bool:
        """Whether writes go on a thread here: on CPU. With CUDA, Megatron's own callers
        copy device tensors to host memory first and write from another process."""
        return not torch.cuda.is_available()


def in_process_results() -> None:
    """Have Megatron's async writes report their results through an in-process queue
    (``ThreadCallsQueue``): set where no save asked for the Manager queue yet (a process
    whose writes go to another process keeps it)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:  # pyright: ignore[reportPrivateUsage]
        filesystem_async._results_queue = queue.Queue()  # pyright: ignore[reportPrivateUsage]
