"""The training data as an endless, resumable stream of batches.

``LoaderStream`` wraps what the user gives (a ``DataLoader``, torchdata's
``StatefulDataLoader``, or any re-iterable of batches) and hands out one batch at a
time. Its position is part of every checkpoint:

- a loader with ``state_dict`` / ``load_state_dict`` (``StatefulDataLoader``) restores
  its own state: a resumed run sees exactly the batches an uninterrupted run would;
- anything else is counted: on resume the stream calls ``set_epoch`` on the sampler
  (if it has one), starts the epoch again from the random state it started with (the
  torch RNG and every ``torch.Generator`` the loader draws its order from: its
  ``generator=``, its samplers', a sampler Fabric wrapped for a rank's shard), so a
  ``DataLoader(shuffle=True)`` draws the same order, and skips the batches already
  read. That is exact when the data's order depends only on those (a shuffled
  DataLoader, a seeded sampler, a fixed list); it costs one pass over the skipped
  batches. The loader's generators are left as an uninterrupted run would have them:
  a rollback in the same process replays as exactly as a resume in a fresh one.

At the end of the data (an epoch) the stream either starts the next epoch
(``on_epoch_end="continue"``) or raises ``DataExhausted`` (``"stop"``: the driver
stops the run there); an iterable that
yields nothing at all is an error, never a hang.

Example::

    stream = LoaderStream(loader, on_epoch_end="continue")
    batch = stream.next()
    state = stream.state_dict()        # {"epoch": 0, "batches": 1, "loader": {...}}
    stream.load_state_dict(state)      # the next batch is the one after `batch`
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from baton.backends.fabric.elastic import GlobalBatches
from baton.core.backend import DataExhausted
from baton.core.errors import UsageError


class LoaderStream:
    """One batch at a time from a re-iterable; the position survives checkpoints."""

    def __init__(
        self,
        data: Iterable[Any],
        *,
        on_epoch_end: str = "continue",
        epoch_ended: Callable[[int], None] | None = None,
        use_loader_state: bool = True,
        world_size: int = 1,
    ) -> None:
        if on_epoch_end not in ("continue", "stop"):
            raise ValueError(f"on_epoch_end must be 'continue' or 'stop', got {on_epoch_end!r}")
        if isinstance(data, Iterator):
            raise TypeError(
                f"training data is a one-shot iterator ({type(data).__name__}): it can be "
                "neither resumed nor started again for a new epoch; pass a DataLoader, a "
                "StatefulDataLoader, a list, or an object whose __iter__ starts over"
            )
        self.data = data
        #: ranks reading their own shards (a position counted per rank is theirs only)
        self.world_size = world_size
        #: the position is global (``GlobalBatches``): it resumes on any number of ranks
        self.elastic = isinstance(data, GlobalBatches)
        self.on_epoch_end = on_epoch_end
        self.epoch_ended = epoch_ended
        #: epochs completed
        self.epoch = 0
        #: batches handed out in the current epoch
        self.batches = 0
        self._iterator: Iterator[Any] | None = None
        self._stateful = (
            use_loader_state and hasattr(data, "state_dict") and hasattr(data, "load_state_dict")
        )
        #: the torch RNG state when this epoch's iterator was made (a shuffle's seed)
        self._epoch_rng: Any = None
        #: the loader's own generators (its shuffle's randomness), and their states
        #: when this epoch's iterator was made
        self._generators = [] if self._stateful else order_generators(data)
        self._epoch_generators: list[Any] = []

    def next(self) -> Any:
        """The next batch; at the end of the data, the next epoch's first (or ``DataExhausted``)."""
        if self._iterator is None:
            self._start()
        assert self._iterator is not None
        try:
            batch = next(self._iterator)
        except StopIteration:
            if self.batches == 0:
                raise ValueError(
                    f"the training data ({type(self.data).__name__}) yielded no batch in "
                    f"epoch {self.epoch}: it is empty (check its length and batch size)"
                ) from None
            self.epoch += 1
            self.batches = 0
            self._iterator = None
            if self.epoch_ended is not None:
                self.epoch_ended(self.epoch - 1)
            if self.on_epoch_end == "stop":
                raise DataExhausted(f"end of epoch {self.epoch - 1} of the training data") from None
            return self.next()
        self.batches += 1
        return batch

    def _start(self) -> None:
        import torch

        _set_epoch(self.data, self.epoch)  # a DistributedSampler reshuffles per epoch
        if not self._stateful:
            self._epoch_rng = torch.get_rng_state()
            self._epoch_generators = [g.get_state() for g in self._generators]
        self._iterator = iter(self.data)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "batches": self.batches,
            "world_size": self.world_size,
        }
        if self._stateful:
            state["loader"] = self.data.state_dict()  # type: ignore[attr-defined]
            return state
        if self._iterator is not None and self._epoch_rng is not None:
            state["epoch_rng"] = self._epoch_rng
            state["generators"] = self._epoch_generators
        elif self._generators:  # the epoch starts at the next batch, from these states
            state["generators"] = [g.get_state() for g in self._generators]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` was taken: restore the loader, or skip what was read.

        A position saved on another number of ranks is refused (``UsageError`` naming both)
        unless the data is ``GlobalBatches``, whose position is global."""
        saved_ranks = int(state.get("world_size", self.world_size))
        if saved_ranks != self.world_size and not self.elastic:
            raise UsageError(
                f"the checkpoint's data position was taken on {saved_ranks} rank(s), this run "
                f"has {self.world_size}: {type(self.data).__name__} keeps a position per rank "
                "(each rank its own shard), which does not continue at the same sample on "
                f"another number of ranks. Resume on {saved_ranks} rank(s); or read the data "
                "through baton.backends.fabric.elastic.GlobalBatches (the recipes' prepared "
                "data does), whose position is global; or start from the weights only "
                "(FabricConfig.init_from)"
            )
        self.epoch = int(state["epoch"])
        self.batches = int(state["batches"])
        _set_epoch(self.data, self.epoch)
        if self._stateful and "loader" in state:
            self.data.load_state_dict(state["loader"])  # type: ignore[attr-defined]
            self._iterator = iter(self.data)
            return
        import torch

        saved_generators: list[Any] = state.get("generators") or []
        if saved_generators and len(saved_generators) != len(self._generators):
            raise ValueError(
                f"cannot resume the data position: the checkpoint recorded "
                f"{len(saved_generators)} random generator(s) of the training data's order, "
                f"this loader has {len(self._generators)}; resume with the data loader the "
                "run was saved with"
            )
        for generator, saved in zip(self._generators, saved_generators, strict=False):
            generator.set_state(saved)
        if self.batches == 0:
            self._iterator = None  # the epoch starts at the next batch, as it would have
            return
        # a shuffling sampler draws its seed when its iterator is made and first advanced:
        # both happen under the RNG state the epoch started with
        now = torch.get_rng_state()
        if state.get("epoch_rng") is not None:
            torch.set_rng_state(state["epoch_rng"])
        try:
            self._start()
            assert self._iterator is not None
            for skipped in range(self.batches):
                try:
                    next(self._iterator)
                except StopIteration:
                    raise ValueError(
                        f"cannot resume the data position: epoch {self.epoch} of the training "
                        f"data has only {skipped} batches, the checkpoint had read "
                        f"{self.batches}; resume with the data the run was saved with"
                    ) from None
        finally:
            torch.set_rng_state(now)


#: where a loader keeps what draws its order: its samplers, and a sampler wrapped in
#: another (Fabric's ``DistributedSamplerWrapper`` holds the user's in ``dataset._sampler``)
_ORDER_ATTRIBUTES = ("generator", "sampler", "batch_sampler", "_sampler")


class TrainingStream(Protocol):
    """What a Fabric step draws its batches from: a ``LoaderStream`` over the user's
    data, or a ``rollout_rows.RolloutStream`` of each step's rollouts; its position goes
    into every checkpoint."""

    def next(self) -> Any:
        """The next batch."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class DataPosition:
    """Where a run's training data stands: the stream this rank reads and the samples
    every rank drew together (the data position core records). The backend advances it
    each step; its checkpoint I/O saves and restores it.

    Example::

        position = DataPosition()
        position.stream = shard_stream(fabric, loader, "continue")   # in setup
        position.samples += 32                                       # after a step
    """

    stream: TrainingStream | None = None
    samples: int = 0


def order_generators(data: Any) -> list[Any]:
    """The ``torch.Generator`` objects ``data`` draws its order from: the loader's
    ``generator=`` and its samplers' (followed through wrapping samplers), each once.

    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> g = torch.Generator().manual_seed(0)
    >>> order_generators(DataLoader(range(8), shuffle=True, generator=g)) == [g]
    True
    """
    import torch
    from torch.utils.data import Sampler

    found: dict[int, Any] = {}

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, torch.Generator):
            found.setdefault(id(value), value)
            return
        if value is None or depth > 4:
            return
        names = _ORDER_ATTRIBUTES + (("dataset",) if isinstance(value, Sampler) else ())
        for name in names:
            inner = getattr(value, name, None)
            if isinstance(inner, torch.Generator | Sampler) or hasattr(inner, "_sampler"):
                visit(inner, depth + 1)

    visit(data, 0)
    return list(found.values())


def _set_epoch(data: Any, epoch: int) -> None:
    """``set_epoch`` on the loader's sampler (or its batch sampler's), where it has one."""
    for sampler in (
        getattr(data, "sampler", None),
        getattr(getattr(data, "batch_sampler", None), "sampler", None),
    ):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)


def count_batch(batch: Any) -> tuple[int, int]:
    """``(samples, tokens)`` read from a batch's shapes (no device sync).

    The first tensor found (a tensor, the first of a tuple/list, ``input_ids`` or the
    first value of a dict) gives the samples (its first dimension) and, when it is a
    2-D integer tensor (token ids), the tokens (its element count); otherwise tokens
    are 0 and a ``count_tokens`` hook should say how to count them.
    """
    import torch

    tensor = _first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        return 0, 0
    samples = int(tensor.shape[0])
    is_ids = tensor.dim() == 2 and not torch.is_floating_point(tensor)
    return samples, int(tensor.numel()) if is_ids else 0


def _first_tensor(batch: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        if "input_ids" in batch:
            return batch["input_ids"]
        values = list(batch.values())
    elif isinstance(batch, list | tuple):
        values = list(batch)
    else:
        return None
    for value in values:
        found = _first_tensor(value)
        if found is not None:
            return found
    return None


def shard_stream(
    fabric: Any,
    data: Iterable[Any],
    on_epoch_end: str,
    epoch_ended: Callable[[int], None] | None = None,
) -> LoaderStream:
    """The ``LoaderStream`` of ``data`` for this rank of ``fabric``: with several ranks, a
    ``DataLoader`` over a map-style dataset without a ``DistributedSampler`` is re-made by
    Fabric so that each rank reads its own shard (seeded, per epoch); its position is
    then counted and skipped on resume (the re-made loader's own state does not restore
    exactly). ``GlobalBatches`` shards itself: rank ``r`` of ``n`` reads its slice of each
    global batch, and its position resumes on any number of ranks."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    use_loader_state = True
    if isinstance(data, GlobalBatches):
        data = data.shard(fabric.global_rank, fabric.world_size)
    elif (
        fabric.world_size > 1
        and isinstance(data, DataLoader)
        and not isinstance(data.sampler, DistributedSampler)
        and not isinstance(data.dataset, torch.utils.data.IterableDataset)
    ):
        wrapped = fabric.setup_dataloaders(data, move_to_device=False)
        data = getattr(wrapped, "_dataloader", wrapped)
        use_loader_state = False
    return LoaderStream(
        data,
        on_epoch_end=on_epoch_end,
        epoch_ended=epoch_ended,
        use_loader_state=use_loader_state,
        world_size=fabric.world_size,
    )
