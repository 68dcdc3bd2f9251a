"""What Megatron-Core needs to run on a machine without a GPU, one function per fix.

Megatron-Core 0.19 assumes CUDA in a handful of places on the training path: the
RNG tracker (``torch.cuda.get_rng_state``), the global memory buffer and several
buffers allocated on ``torch.cuda.current_device()``, the default causal mask and
many small tensors created with ``device="cuda"``, ``Tensor.type()`` checks against
``torch.cuda.FloatTensor``, and stream / synchronize calls. Each ``install_*``
function below makes one of those work on CPU and records how to undo it in a
``PatchRecorder``; the patches in ``baton.backends.megatron.patches`` call them, and
a plain script can call them too::

    from baton.core.patches import PatchRecorder
    from baton.backends.megatron import cpu

    recorder = PatchRecorder()
    cpu.install_all(recorder)
    ...  # Megatron-Core calls run on CPU
    recorder.undo()
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from baton.core.patches import PatchRecorder

# -- RNG tracker ------------------------------------------------------------------------


def _cpu_tracker_class() -> type:
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    class CpuRNGStatesTracker(CudaRNGStatesTracker):
        """Megatron's named RNG streams (data parallel, model parallel, expert) kept as
        CPU generator states: ``fork(name)`` swaps the CPU default generator's state."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            outer_name = self._current_state_name
            if outer_name != "default-rng":
                self.states_[outer_name] = outer
            torch.set_rng_state(self.states_[name])
            self._current_state_name = name
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                if outer_name != "default-rng":
                    outer = self.states_[outer_name]
                torch.set_rng_state(outer)
                self._current_state_name = outer_name

    return CpuRNGStatesTracker


def install_rng_tracker(recorder: PatchRecorder) -> None:
    """Replace the CUDA RNG tracker by one over CPU generator states.

    ``model_parallel_cuda_manual_seed`` then seeds the CPU streams; ``get_cuda_rng_tracker``
    returns the CPU tracker. Undo restores the previous tracker (usually none).
    """
    from megatron.core.tensor_parallel import random as mrandom

    recorder.setattr(mrandom, "_CUDA_RNG_STATE_TRACKER", _cpu_tracker_class()())
    recorder.setattr(mrandom, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", True)


# -- global memory buffer -----------------------------------------------------------------


def install_memory_buffer(recorder: PatchRecorder) -> None:
    """Let ``GlobalMemoryBuffer.get_tensor`` allocate on CPU (it uses the current CUDA device).

    Patched on the class, so the buffer that ``initialize_model_parallel`` creates (and
    every later one) allocates on CPU without redoing anything after each init.
    """
    from megatron.core.utils import GlobalMemoryBuffer

    def get_tensor(
        self: Any,
        tensor_shape: Any,
        dtype: torch.dtype,
        name: str,
        mem_alloc_context: Callable[[], Any] | None = None,
    ) -> torch.Tensor:
        required = 1
        for size in tensor_shape:
            required *= int(size)
        current = self.buffer.get((name, dtype))
        if current is None or current.numel() < required:
            self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu")
        return self.buffer[(name, dtype)][0:required].view(*tensor_shape)

    recorder.setattr(GlobalMemoryBuffer, "get_tensor", get_tensor)


# -- causal mask --------------------------------------------------------------------------


def install_causal_mask(recorder: PatchRecorder) -> None:
    """The default causal mask (used when no mask is passed) built on CPU.

    ``megatron.core.fusions.fused_softmax`` imported the function by name, so both
    module attributes are replaced.
    """
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils as tutils

    def get_default_causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    recorder.setattr(tutils, "get_default_causal_mask", get_default_causal_mask)
    recorder.setattr(fused_softmax, "get_default_causal_mask", get_default_causal_mask)


# -- "cuda" device arguments ----------------------------------------------------------------


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare index means a CUDA device
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


class CudaMeansCpu(TorchFunctionMode):
    """A torch function mode in which CUDA device arguments mean the CPU.

    ``device="cuda"`` / ``cuda:N`` / an index becomes ``"cpu"``, ``tensor.cuda()``
    returns the tensor, and ``tensor.type()`` names a CPU float tensor as its CUDA
    type (Megatron asserts ``grad.type() == 'torch.cuda.FloatTensor'``).
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and "dtype" not in kwargs:
            name = func(*args, **kwargs)
            return name.replace("torch.", "torch.cuda.", 1) if ".cuda." not in name else name
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.to and args and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


#: Megatron's collectives that allocate on ``torch.cuda.current_device()`` and run inside
#: autograd's backward (the expert dispatcher's gathers and reduce-scatters)
BACKWARD_COLLECTIVES = (
    "_gather_along_last_dim",
    "_gather_along_first_dim",
    "_reduce_scatter_along_first_dim",
)


def _in_device_mode(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` run under ``CudaMeansCpu`` even where the mode is off: a mode is
    off while it handles a call, and a backward pass reaches it as one call
    (``torch.autograd.backward``), so the backward functions it runs see no mode."""
    from torch.overrides import _get_current_function_mode

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if isinstance(_get_current_function_mode(), CudaMeansCpu):
            return function(*args, **kwargs)
        with CudaMeansCpu():
            return function(*args, **kwargs)

    return wrapped


def install_device_mode(recorder: PatchRecorder) -> None:
    """Enter ``CudaMeansCpu`` and make ``torch.cuda.current_device()`` answer 0; Megatron's
    :data:`BACKWARD_COLLECTIVES` enter the mode themselves (they run in backward passes).

    The mode stays active until undone (it is a per-thread stack: undo pops it, so
    modes entered after it must be left first).
    """
    from megatron.core.tensor_parallel import mappings

    mode = CudaMeansCpu()
    mode.__enter__()
    recorder.on_undo("exit CudaMeansCpu", lambda: mode.__exit__(None, None, None))
    recorder.setattr(torch.cuda, "current_device", lambda: 0)
    for name in BACKWARD_COLLECTIVES:
        recorder.setattr(mappings, name, _in_device_mode(getattr(mappings, name)))


@contextlib.contextmanager
def device_mode_paused() -> Iterator[None]:
    """Leave ``CudaMeansCpu`` for a block that asks for no CUDA device, then enter it
    again (where it is this thread's innermost mode; otherwise nothing changes).

    The mode costs a Python call per torch call. Building and planning an asynchronous
    save makes thousands of them (Megatron's sharded tensors turned into torch's, the
    save plan) and none names CUDA; the save's finalization does (it runs later,
    under the mode)::

        with device_mode_paused():
            request = dist_checkpointing.save(state, path, async_sharded_save=True, ...)
    """
    from torch.overrides import _get_current_function_mode, _pop_mode_temporarily

    if not isinstance(_get_current_function_mode(), CudaMeansCpu):
        yield
        return
    with _pop_mode_temporarily():
        yield


# -- streams and synchronisation ------------------------------------------------------------


class _NoStream:
    """Stands in for ``torch.cuda.Stream`` on CPU: work is already ordered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> None:
        return None


def install_streams(recorder: PatchRecorder) -> None:
    """``torch.cuda.synchronize`` / ``current_stream`` / ``Stream`` / ``stream`` /
    ``empty_cache`` as no-ops (CPU work is synchronous)."""
    recorder.setattr(torch.cuda, "synchronize", lambda device=None: None)
    recorder.setattr(torch.cuda, "current_stream", lambda device=None: _NoStream())
    recorder.setattr(torch.cuda, "Stream", _NoStream)
    recorder.setattr(torch.cuda, "stream", lambda stream=None: contextlib.nullcontext())
    recorder.setattr(torch.cuda, "empty_cache", lambda: None)


def install_all(recorder: PatchRecorder) -> None:
    """Every CPU fix, in the order the patches apply them."""
    install_streams(recorder)
    install_device_mode(recorder)
    install_rng_tracker(recorder)
    install_memory_buffer(recorder)
    install_causal_mask(recorder)
