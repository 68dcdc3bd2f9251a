"""Loading a torch distributed checkpoint (DCP), or a ``torch.save`` checkpoint file,
never runs code found in it.

torch's ``FileSystemReader.read_metadata`` unpickles the checkpoint's ``.metadata`` file
with plain ``pickle`` and ``DefaultLoadPlanner.load_bytes`` reads byte entries with
``torch.load(weights_only=False)``: a crafted checkpoint runs arbitrary code when it is
resumed. TorchTitan and Megatron-Core both load through these. This patch restricts
both to an allow-list (DCP's metadata dataclasses, dtypes, sizes, paths; numpy arrays in
byte entries); anything else is refused with ``UnsafeCheckpointError`` before it is
created or called:

- byte entries (``torch.save`` archives) are checked with torch's weights-only
  unpickler (``torch.load(weights_only=True)``) under ``safe_globals``;
- ``.metadata`` is a plain pickle of protocol 4 or later, whose opcodes torch's
  weights-only unpickler does not read, so it is read by ``pickle.Unpickler`` with a
  ``find_class`` that resolves only the allow-listed names (nothing else can be named,
  so nothing else can be called).

Registration::

    # packages/backends/src/baton/backends/<backend>/patches.py
    from baton.backends.dcp_safety import dcp_safe_loading

    register_patch(dcp_safe_loading("torchtitan"))

It applies to torch versions whose weights-only unpickler accepts an allow-list
(``TORCH_VERSIONS``) and whose DCP still has these two entry points; the run's patch
report says why it is skipped elsewhere. Nothing here imports torch at import time.

A ``torch.save`` file loaded directly (a Fabric or LightningModule checkpoint's
``state.pt``) is read by torch's weights-only unpickler under the same allow-list::

    with weights_only_loading(path):          # refusal: UnsafeCheckpointError naming path
        state = fabric.load(path, live_objects, weights_only=True)
    state = load_weights_only(path, mmap=True)
"""

from __future__ import annotations

import functools
import importlib
import io
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baton.core.checkpoints.files import CheckpointError
from baton.core.patches import Patch, PatchRecorder, version_matches

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView

#: torch releases whose ``torch.serialization.safe_globals`` and DCP layout this fits
TORCH_VERSIONS = ">=2.6,<2.14"

#: what a DCP ``.metadata`` pickle may name (besides torch's dtypes)
METADATA_GLOBALS = (
    "torch:Size",
    "torch.serialization:_get_layout",
    "collections:OrderedDict",
    "torch.distributed.checkpoint.metadata:Metadata",
    "torch.distributed.checkpoint.metadata:MetadataIndex",
    "torch.distributed.checkpoint.metadata:StorageMeta",
    "torch.distributed.checkpoint.metadata:TensorProperties",
    "torch.distributed.checkpoint.metadata:TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata:BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata:ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata:_MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem:_StorageInfo",
    # a plan's file prefix (one string), in the plans Megatron's cached saves record
    "torch.distributed.checkpoint.filesystem:_StoragePrefix",
    "torch.distributed.checkpoint.planner:SavePlan",
    "torch.distributed.checkpoint.planner:WriteItem",
    "torch.distributed.checkpoint.planner:WriteItemType",
    "torch.distributed.checkpoint.planner:TensorWriteData",
    "pathlib:PosixPath",
    "pathlib:WindowsPath",
)

#: what a byte entry may name (Megatron-Core keeps numpy RNG states there)
BYTES_GLOBALS = (
    "numpy._core.multiarray:_reconstruct",
    "numpy:ndarray",
    "numpy:dtype",
)


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """A checkpoint file names something other than checkpoint data: it was refused (a
    ``CheckpointError``: one line, wherever a resume meets it)."""


@functools.cache
def _allowed(names: tuple[str, ...]) -> dict[tuple[str, str], Any]:
    """``(module, name) -> object`` for the allow-listed names and torch's dtypes."""
    import torch

    found: dict[tuple[str, str], Any] = {
        ("torch", name): value
        for name, value in vars(torch).items()
        if isinstance(value, torch.dtype)
    }
    for entry in names:
        module_name, attr = entry.split(":")
        try:
            found[(module_name, attr)] = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError):
            continue  # absent in this torch or numpy: nothing to allow
    return found


def _safe_globals(names: tuple[str, ...]) -> list[Any]:
    """The allow-list in the form ``torch.serialization.safe_globals`` takes."""
    import numpy

    dtype_classes = [
        getattr(numpy.dtypes, name) for name in dir(numpy.dtypes) if name.endswith("DType")
    ]
    return [(obj, f"{module}.{name}") for (module, name), obj in _allowed(names).items()] + (
        dtype_classes
    )


#: what a ``torch.save`` checkpoint file may name, besides what torch's weights-only
#: unpickler allows by default (tensors, containers, numbers, strings)
CHECKPOINT_GLOBALS = METADATA_GLOBALS + BYTES_GLOBALS

#: the line of torch's weights-only refusal that names what was refused
_TORCH_REASON = "WeightsUnpickler error:"


def _reason(error: Exception) -> str:
    """The one line of ``error`` that says what was refused (torch's own message is a
    paragraph of advice first)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if line.startswith(_TORCH_REASON):
            return line.removeprefix(_TORCH_REASON).split(". Please")[0].strip()
    return lines[0] if lines else type(error).__name__


def _refused(what: str, error: Exception) -> UnsafeCheckpointError:
    reason = _reason(error)
    return UnsafeCheckpointError(
        f"refused to load {what}: it names something that is not checkpoint data ({reason}); "
        "a crafted or foreign checkpoint would run code here. Resume only from checkpoints "
        "you trust"
    )


_REFUSALS = (pickle.UnpicklingError, AttributeError, TypeError, ValueError, RuntimeError)


class _MetadataUnpickler(pickle.Unpickler):
    """A pickle reader that can name only the allow-listed classes and functions."""

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(METADATA_GLOBALS).get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed")
        return found


def restricted_load(file: Any, what: str = "checkpoint metadata") -> Any:
    """Unpickle a plain pickle ``file`` (DCP's ``.metadata``) allowing only the DCP
    metadata classes (``METADATA_GLOBALS``) and torch's dtypes."""
    try:
        return _MetadataUnpickler(file).load()
    except _REFUSALS as error:
        raise _refused(what, error) from None


def check_saved_bytes(value: io.BytesIO, what: str) -> None:
    """Refuse a ``torch.save`` byte entry that names anything outside the allow-list."""
    import torch

    with torch.serialization.safe_globals(_safe_globals(CHECKPOINT_GLOBALS)):
        try:
            torch.load(value, map_location="cpu", weights_only=True)
        except _REFUSALS as error:
            raise _refused(what, error) from None


@contextmanager
def weights_only_loading(file: str | Path) -> Iterator[None]:
    """Inside, torch's weights-only unpickler also accepts ``CHECKPOINT_GLOBALS``, and its
    refusal of ``file`` (anything else named in it) is an ``UnsafeCheckpointError``
    naming ``file``. Loads inside must pass ``weights_only=True``."""
    import torch

    with torch.serialization.safe_globals(_safe_globals(CHECKPOINT_GLOBALS)):
        try:
            yield
        except pickle.UnpicklingError as error:
            if isinstance(error, UnsafeCheckpointError) or "weights only" not in (
                str(error).lower()
            ):
                raise  # already refused, or a damaged file: not a question of safety
            raise _refused(str(file), error) from None


def load_weights_only(file: str | Path, **kwargs: Any) -> Any:
    """``torch.load(file, map_location="cpu", weights_only=True, **kwargs)`` under
    ``weights_only_loading``: a file naming anything outside the allow-list is refused
    before it is created or called."""
    import torch

    with weights_only_loading(file):
        return torch.load(file, map_location="cpu", weights_only=True, **kwargs)


class _MetadataPickle:
    """Stands in for the ``pickle`` module inside DCP's filesystem reader: ``load`` is
    restricted, everything else (``dump`` for saving) is the real module's."""

    @staticmethod
    def load(file: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(file, "name", None)
        return restricted_load(file, f"{name}" if name else "checkpoint metadata")

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


def _checked_load_bytes(original: Callable[..., None]) -> Callable[..., None]:
    def load_bytes(self: Any, read_item: Any, value: io.BytesIO) -> None:
        # proven harmless first (weights-only, allow-list); then loaded as torch does
        check_saved_bytes(value, f"checkpoint entry {read_item.dest_index.fqn!r}")
        value.seek(0)
        original(self, read_item, value)

    load_bytes.__wrapped__ = original  # type: ignore[attr-defined]
    return load_bytes


class DcpSafeLoading(Patch):
    """Load DCP checkpoints with torch's weights-only unpickler: a crafted .metadata or
    byte entry is refused instead of running code."""

    phase = "configure"
    priority = -1100

    def condition(self, backend: Backend) -> tuple[bool, str]:
        import torch

        installed = torch.__version__.split("+")[0]
        if not version_matches(TORCH_VERSIONS, installed):
            return False, f"torch {installed} is outside {TORCH_VERSIONS}"
        from torch.distributed.checkpoint import default_planner, filesystem

        if getattr(filesystem, "pickle", None) is not pickle or not hasattr(
            default_planner.DefaultLoadPlanner, "load_bytes"
        ):
            return False, "torch's DCP reader no longer loads metadata with pickle"
        return True, f"torch {installed}"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        from torch.distributed.checkpoint import default_planner, filesystem

        planner = default_planner.DefaultLoadPlanner
        recorder.setattr(filesystem, "pickle", _MetadataPickle())
        recorder.setattr(planner, "load_bytes", _checked_load_bytes(planner.load_bytes))


def dcp_safe_loading(backend: str) -> type[Patch]:
    """The safe-loading patch for one backend (register it with ``register_patch``)."""
    return type(
        f"DcpSafeLoading_{backend}",
        (DcpSafeLoading,),
        {
            "name": f"{backend}_dcp_safe_loading",
            "backend": backend,
            "__doc__": DcpSafeLoading.__doc__,
        },
    )
