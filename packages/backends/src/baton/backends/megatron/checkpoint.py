"""Megatron checkpoints: ``dist_checkpointing`` layouts, RNG and optimizer-state repairs,
and clear errors when a load fails.

What the backend's ``save`` and ``load`` call besides ``dist_checkpointing`` itself:
``load_plan`` (whether a saved tensor/pipeline/data layout can be resharded here),
``model_sharded_state`` / ``load_model_state`` (one or several model chunks),
``rng_state`` / ``set_rng_state``, ``init_optimizer_state`` and
``restore_optimizer_steps`` (a distributed optimizer before and after loading), and
``naming_failures`` (re-raises a failure as ``CheckpointLoadError`` naming the call).

Example::

    with naming_failures(f"dist_checkpointing.load({directory})"):
        state = dist_checkpointing.load(request, str(directory))
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from baton.backends.async_save import SaveHandle
from baton.core.checkpoint_record import LOAD_ALL, LoadPlan
from baton.core.checkpoints.files import native_dir

log = logging.getLogger("baton")


class MegatronSave(SaveHandle):
    """A ``dist_checkpointing`` async save in flight on Megatron's calls queue.

    Polling asks every rank (one small all-reduce, as Megatron requires); the driver
    polls on every rank at the same steps, so the ranks agree. The save is done once
    Megatron has finalized its call (``index``), whether later saves are still writing.
    """

    def __init__(self, queue: Any, index: int) -> None:
        self.queue = queue
        self.index = index

    def _poll(self) -> bool:
        self.queue.maybe_finalize_async_calls(blocking=False)
        return all(active.idx != self.index for active in self.queue.async_calls)

    def _join(self) -> None:
        self.queue.maybe_finalize_async_calls(blocking=True)


class AsyncSaves:
    """A process's asynchronous saves: Megatron's calls queue (the write on a thread on
    CPU, ``thread_writer.ThreadCallsQueue``; Megatron's forked writer with CUDA) and one
    save strategy whose plans Megatron caches and reuses from the third save on. The
    sharding is validated at the first save only: the layout cannot change within a
    process (Megatron-LM's ``--ckpt-assume-constant-structure``)::

        saves = AsyncSaves()
        handle = saves.start(sharded_state, directory)  # returns once the write is queued
        saves.wait_for_staging()                         # before the next optimizer step
        saves.close()                                    # at teardown: finish the writes
    """

    def __init__(self) -> None:
        self.queue: Any = None
        self._strategy: Any = None
        self._staging: Callable[[], None] | None = None  # the thread writer's copy

    def start(self, state: dict[str, Any], directory: Path) -> MegatronSave:
        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue
        from megatron.core.dist_checkpointing.strategies.torch import (
            TorchDistSaveShardedStrategy,
        )

        from baton.backends.megatron.thread_writer import ThreadCallsQueue

        first = self.queue is None
        if first:
            usable = ThreadCallsQueue.usable()
            self.queue = ThreadCallsQueue() if usable else AsyncCallsQueue(persistent=False)
            self._staging = self.queue.wait_for_staging if usable else None
            self._strategy = TorchDistSaveShardedStrategy(cached_metadata=True)
        request = dist_checkpointing.save(
            state,
            str(directory),
            sharded_strategy=self._strategy,
            validate_access_integrity=first,
            async_sharded_save=True,
            async_strategy="mcore",
        )
        return MegatronSave(self.queue, self.queue.schedule_async_request(request))

    def wait_for_staging(self) -> None:
        """Block while a save still copies what the optimizer step changes (CPU writer)."""
        if self._staging is not None:
            self._staging()

    def close(self) -> None:
        if self.queue is not None:
            self.queue.close()
            self.queue = self._strategy = self._staging = None


def show_layout(layout: Mapping[str, Any]) -> str:
    text = (
        f"tensor {layout.get('tensor')} x pipeline {layout.get('pipeline')}"
        f" (virtual {layout.get('virtual_pipeline', 1)}) x data {layout.get('data')}"
    )
    if layout.get("expert", 1) > 1:
        text += f", expert {layout['expert']}"
    return text + (", distributed optimizer" if layout.get("distributed_optimizer") else "")


class CheckpointLoadError(RuntimeError):
    """A Megatron checkpoint could not be loaded; the message names the call and the cause."""


def describe_error(error: BaseException) -> str:
    """``Type: message``; for an exception without a message (a bare ``assert``), the
    file, line and source text where it was raised instead."""
    import traceback

    text = str(error).strip()
    if text:
        return f"{type(error).__name__}: {text}"
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return type(error).__name__
    last = frames[-1]
    where = f"{Path(last.filename).name}:{last.lineno} in {last.name}"
    return f"{type(error).__name__} at {where}: {(last.line or '').strip()}"


@contextlib.contextmanager
def naming_failures(what: str) -> Iterator[None]:
    try:
        yield
    except CheckpointLoadError:
        raise
    except Exception as error:
        raise CheckpointLoadError(f"{what} failed: {describe_error(error)}") from error


def rng_state() -> dict[str, Any]:
    import random

    import numpy
    from megatron.core import tensor_parallel

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": numpy.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy
    from megatron.core import tensor_parallel

    random.setstate(state["python"])
    numpy.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def load_plan(saved: Mapping[str, Any], current: Mapping[str, Any]) -> LoadPlan:
    """How a checkpoint of layout ``saved`` loads onto ``current``: ``dist_checkpointing``
    reshards it, its RNG states left fresh where the model-parallel shards differ; or
    why it cannot."""
    model_parallel = ("tensor", "pipeline", "virtual_pipeline", "expert")
    # a checkpoint from before expert parallelism has no "expert": it had one degree
    same_model_parallel = all(saved.get(k, 1) == current.get(k, 1) for k in model_parallel)
    problem = None
    if saved.get("padded_vocab_size", current["padded_vocab_size"]) != current["padded_vocab_size"]:
        problem = (
            f"the embedding has {saved['padded_vocab_size']} rows there and "
            f"{current['padded_vocab_size']} here (the vocabulary is padded to a multiple "
            "of make_vocab_size_divisible_by x tensor parallel); set config.vocab_size to "
            "a multiple of that for both tensor sizes"
        )
    elif saved.get("expert", 1) != current.get("expert", 1):
        problem = (
            "Megatron's optimizer state follows the expert-parallel degree (one optimizer "
            "at 1; above it a dense and an expert optimizer, the experts' state split over "
            "the expert-parallel ranks)"
        )
    elif saved.get("distributed_optimizer") != current["distributed_optimizer"]:
        problem = (
            "the optimizer state is sharded differently with and without the distributed optimizer"
        )
    elif current["distributed_optimizer"] and not same_model_parallel:
        problem = (
            "the distributed optimizer's dp_reshardable state reshards only over "
            "data parallel ranks"
        )
    if problem:
        return LoadPlan(
            refusal=f"{problem}; resume with the saved layout, or start from its weights only"
        )
    if not same_model_parallel:
        log.info(
            "resharding checkpoint from %s to %s (RNG states start fresh)",
            show_layout(saved),
            show_layout(current),
        )
    return LOAD_ALL if same_model_parallel else LoadPlan(fresh=frozenset({"rng"}))


def model_sharded_state(chunks: list[Any]) -> dict[str, Any]:
    """The chunks' sharded state: ``model`` for one chunk, ``model0``, ``model1``...
    under a virtual pipeline (Megatron-LM's names). Tensors are keyed by their global
    names, so a checkpoint loads under another pipeline or tensor layout."""
    if len(chunks) == 1:
        return chunks[0].module.sharded_state_dict()
    merged: dict[str, Any] = {}
    for index, chunk in enumerate(chunks):
        merged.update(
            {f"model{index}.{k}": v for k, v in chunk.module.sharded_state_dict().items()}
        )
    return merged


def load_model_state(chunks: list[Any], state: dict[str, Any]) -> None:
    if len(chunks) == 1:
        chunks[0].module.load_state_dict(state, strict=True)
        return
    for index, chunk in enumerate(chunks):
        prefix = f"model{index}."
        own = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        chunk.module.load_state_dict(own, strict=True)


def init_optimizer_state(optimizer: Any) -> None:
    """Give a distributed optimizer that has not stepped yet its state tensors.

    Its sharded state dict reads every parameter's Adam state (and, without Apex or
    Transformer Engine, the common ``step``), which exist only after a step; a fresh
    process has none. Megatron-Core's ``_init_optimizer_states_with_dummy_values`` (its
    own preparation before loading into an unstepped distributed optimizer) steps
    the inner optimizer once on zero gradients; loading then overwrites every value.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(inner, DistributedOptimizer) and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


def restore_optimizer_steps(optimizer: Any, loaded: Any) -> None:
    """Each parameter's Adam ``step`` from the checkpoint, as its own tensor.

    Without Apex or Transformer Engine, Megatron-Core's distributed optimizer saves
    the common step in its param groups and, on load, hands every parameter the same
    step tensor, then copies the per-parameter value from the pre-load state over it;
    torch's Adam increments each parameter's step in place. The resumed update would
    use a wrong bias correction; this sets the saved step, one tensor per parameter.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    states = [loaded] if len(chained) == 1 else [loaded[k] for k in sorted(loaded)]
    for inner, state in zip(chained, states, strict=True):
        if not isinstance(inner, DistributedOptimizer):
            continue
        groups = state.get("optimizer", {}).get("param_groups", [])
        steps = {g["step"] for g in groups if g.get("step") is not None}
        if len(steps) != 1:
            continue
        step = float(steps.pop())
        for param_state in inner.optimizer.state.values():
            if isinstance(param_state.get("step"), torch.Tensor):
                old = param_state["step"]
                param_state["step"] = torch.tensor(step, dtype=old.dtype, device=old.device)


def load_weights(chunks: list[Any], optimizer: Any, directory: Path) -> None:
    """Only the model's weights from ``directory``: a baton checkpoint (or its backend
    folder) through ``dist_checkpointing``'s model-only load, under any layout it can
    reshard, or a ``save_pretrained`` directory through baton's Llama mapping."""
    from megatron.core import dist_checkpointing

    from baton.core.model.spec import is_hf_dir

    if is_hf_dir(directory):
        from baton.backends.megatron.hf import load_hf

        with naming_failures(f"loading Hugging Face weights from {directory}"):
            load_hf(chunks, str(directory))
            optimizer.reload_model_params()
        return
    directory = native_dir(directory)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"init_from {directory} is not a checkpoint directory; pass a checkpoint "
            "step directory (runs/NAME/checkpoints/step_000100) or its backend/ folder"
        )
    with naming_failures(f"dist_checkpointing.load of the model from {directory}"):
        state = dist_checkpointing.load({"model": model_sharded_state(chunks)}, str(directory))
    with naming_failures("restoring the model weights"), torch.no_grad():
        load_model_state(chunks, state["model"])
        optimizer.reload_model_params()  # main (fp32) copies follow the weights
    log.info("started from the weights of %s", directory)
