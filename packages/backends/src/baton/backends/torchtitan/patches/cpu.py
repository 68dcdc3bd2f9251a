"""Run TorchTitan on CPU: the device it picks, and the attention it builds.

``torchtitan_cpu_device`` rebinds TorchTitan's import-time copies of ``"cuda"`` to
``"cpu"``; ``torchtitan_cpu_attention`` swaps FlexAttention (no CPU backward) for SDPA.
Both apply only when torch finds no accelerator::

    baton patches --backend torchtitan     # lists them, with the rest
"""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from baton.backends.torchtitan.patches.common import CpuOnlyPatch
from baton.core.patches import PatchRecorder

if TYPE_CHECKING:
    from baton.core.driver_view import DriverView

#: torchtitan modules that copy ``device_type`` / ``device_module`` at import time
DEVICE_COPIES = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.tools.profiler",
    "torchtitan.models.common.token_dispatcher",
)


def cpu_device_module() -> Any:
    """A device module for ``cpu`` with the calls TorchTitan makes on ``torch.cuda``.

    ``torch.cpu`` lacks the memory statistics API; these report host totals and
    empty peak statistics, so TorchTitan's memory monitor prints zeros instead of failing.
    """
    import torch

    def total_memory() -> int:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 1 << 34

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    return SimpleNamespace(
        __name__="baton_cpu_device_module",
        set_device=torch.cpu.set_device,
        device_count=torch.cpu.device_count,
        current_device=lambda: 0,  # an index, as barrier(device_ids=...) expects
        synchronize=torch.cpu.synchronize,
        is_available=lambda: True,
        get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: SimpleNamespace(
            total_memory=total_memory(), name="cpu"
        ),
        memory_stats=lambda device=None: {},
        reset_peak_memory_stats=noop,
        empty_cache=noop,
        manual_seed=noop,
        manual_seed_all=noop,
    )


def _device_copies(device_type: str, device_module: Any) -> list[tuple[Any, str]]:
    """``(module, attribute)`` of every loaded torchtitan module holding these device names."""
    found: list[tuple[Any, str]] = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("torchtitan") or mod is None:
            continue
        attrs = vars(mod)
        if attrs.get("device_type") == device_type:
            found.append((mod, "device_type"))
        if attrs.get("device_module") is device_module:
            found.append((mod, "device_module"))
    return found


class TorchTitanCpuDevice(CpuOnlyPatch):
    """Run TorchTitan on CPU: it falls back to "cuda" when no accelerator exists.

    ``torchtitan.tools.utils`` picks ``device_type = "cuda"`` when torch finds no
    accelerator, and several modules copy that name (and ``torch.cuda``) at import
    time. This patch imports those modules and rebinds every copy to ``"cpu"`` and a
    CPU device module, fixes the memory monitor's default device, and disables CUDA
    graphs in the config. Undo restores every rebinding, including copies made by
    torchtitan modules imported while the patch was active.
    """

    name = "torchtitan_cpu_device"
    phase = "configure"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        for name in DEVICE_COPIES:
            importlib.import_module(name)
        utils = sys.modules["torchtitan.tools.utils"]
        old_type, old_module = utils.device_type, utils.device_module
        new_module = cpu_device_module()

        cpu = {"device_type": "cpu", "device_module": new_module}
        for mod, attr in _device_copies(old_type, old_module):
            recorder.setattr(mod, attr, cpu[attr])
        original = {"device_type": old_type, "device_module": old_module}

        def rebind_late_imports() -> None:
            # modules imported while patched copied the CPU names: send them back too
            for mod, attr in _device_copies("cpu", new_module):
                setattr(mod, attr, original[attr])

        recorder.on_undo("rebind torchtitan modules imported while patched", rebind_late_imports)
        monitor = sys.modules["torchtitan.components.metrics"].DeviceMemoryMonitor.__init__
        defaults = monitor.__defaults__
        monitor.__defaults__ = ("cpu",)

        def restore_defaults() -> None:
            monitor.__defaults__ = defaults

        recorder.on_undo("DeviceMemoryMonitor default device", restore_defaults)
        config = driver.backend.config
        if config is not None and not config.training.disable_cuda_graphs:
            recorder.setattr(config.training, "disable_cuda_graphs", True)


class TorchTitanCpuAttention(CpuOnlyPatch):
    """Swap FlexAttention for SDPA on CPU: FlexAttention has no CPU backward in torch 2.13.

    Every ``FlexAttention.Config`` in the model config becomes a
    ``ScaledDotProductAttention.Config`` (plain causal attention: document
    boundaries inside a packed pretraining window are not masked, RoPE positions still
    are per document). With post-training data (``PackedDataLoader``: SFT, DPO), whose
    documents must never see each other, it becomes a ``DocumentSdpa.Config`` instead:
    SDPA under the document mask TorchTitan builds from the positions
    (``document_attention.py``). Undo puts the original configs back.
    """

    name = "torchtitan_cpu_attention"
    phase = "configure"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        from torchtitan.models.common.attention import (
            FlexAttention,
            ScaledDotProductAttention,
        )

        config = driver.backend.config
        spec = config.model_spec
        if spec is None:
            return
        replacement = (
            _document_attention if documents_masked(config) else ScaledDotProductAttention.Config
        )
        found = list(spec.model.traverse(FlexAttention.Config))
        for _fqn, _cfg, parent, attr in found:
            if parent is None:  # the model config itself cannot be an attention
                continue
            recorder.setattr(parent, attr, replacement())


def documents_masked(config: Any) -> bool:
    """Whether the run reads post-training rows, whose documents must not attend to
    each other (``PackedDataLoader``)."""
    from baton.backends.torchtitan.packed import PackedDataLoader

    return isinstance(config.dataloader, PackedDataLoader.Config)


def _document_attention() -> Any:
    from baton.backends.torchtitan.document_attention import DocumentSdpa

    return DocumentSdpa.Config()
