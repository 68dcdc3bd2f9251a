"""TorchTitan 0.3 fixes as patches: CPU device, CPU attention, process-wide state.

Each patch is a callback with a version range and an undo (``baton.core.patches``).
They register when ``baton.backends.torchtitan`` is imported; nothing here imports
torch or torchtitan at module level, so listing them is cheap::

    baton patches --backend torchtitan
    BATON_PATCHES=all,-torchtitan_restore_process_state baton run recipes/torchtitan_llama3_debug.py

``torchtitan_cpu_device``, ``torchtitan_cpu_attention`` and
``torchtitan_gloo_fsdp_sum_reduction`` apply only when no accelerator is present;
``torchtitan_fsdp_partial_dtensor`` on multi-rank runs under torch 2.13;
``torchtitan_pipeline_microbatch_step`` with pipeline parallelism under torch 2.13;
``torchtitan_restore_process_state`` applies always.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from baton.backends.dcp_safety import dcp_safe_loading
from baton.core.patches import Patch, PatchRecorder, register_patch
from baton.core.quiet import Quiet, QuietPatch

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver import Driver

VERSIONS = ">=0.3,<0.4"

#: torchtitan modules that copy ``device_type`` / ``device_module`` at import time
DEVICE_COPIES = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.tools.profiler",
    "torchtitan.models.common.token_dispatcher",
)

#: environment variables TorchTitan sets process-wide while it builds and seeds
TORCHTITAN_ENV = (
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
)


def _no_accelerator() -> tuple[bool, str]:
    from torch._utils import _get_available_device_type

    found = _get_available_device_type()
    if found is None:
        return True, "no accelerator found"
    return False, f"accelerator {found!r} present"


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


@register_patch
class TorchTitanCpuDevice(Patch):
    """Run TorchTitan on CPU: it falls back to "cuda" when no accelerator exists.

    ``torchtitan.tools.utils`` picks ``device_type = "cuda"`` when torch finds no
    accelerator, and several modules copy that name (and ``torch.cuda``) at import
    time. This patch imports those modules and rebinds every copy to ``"cpu"`` and a
    CPU device module, fixes the memory monitor's default device, and disables CUDA
    graphs in the config. Undo restores every rebinding, including copies made by
    torchtitan modules imported while the patch was active.
    """

    name = "torchtitan_cpu_device"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> tuple[bool, str]:
        return _no_accelerator()

    def apply(self, driver: Driver, recorder: PatchRecorder) -> None:
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


@register_patch
class TorchTitanCpuAttention(Patch):
    """Swap FlexAttention for SDPA on CPU: FlexAttention has no CPU backward in torch 2.13.

    Every ``FlexAttention.Config`` in the model config becomes a
    ``ScaledDotProductAttention.Config`` (plain causal attention: document
    boundaries inside a packed window are not masked, RoPE positions still are
    per document). Undo puts the original configs back.
    """

    name = "torchtitan_cpu_attention"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> tuple[bool, str]:
        return _no_accelerator()

    def apply(self, driver: Driver, recorder: PatchRecorder) -> None:
        from torchtitan.models.common.attention import (
            FlexAttention,
            ScaledDotProductAttention,
        )

        spec = driver.backend.config.model_spec
        if spec is None:
            return
        found = list(spec.model.traverse(FlexAttention.Config))
        for _fqn, _cfg, parent, attr in found:
            if parent is None:  # the model config itself cannot be an attention
                continue
            recorder.setattr(parent, attr, ScaledDotProductAttention.Config())


@register_patch
class TorchTitanRestoreProcessState(Patch):
    """Undo TorchTitan's process-wide changes on teardown: gc, process group, env, autograd.

    ``Trainer.__init__`` disables the garbage collector (baton runs TorchTitan's
    periodic collection each step instead) and never re-enables it; when it creates
    the process group it sets NCCL/flight-recorder environment variables and turns
    off autograd multithreading; seeding sets ``PYTHONHASHSEED``; deterministic mode
    flips torch's deterministic-algorithms switch. This records the state before the
    run and restores it afterwards, destroying the process group if it was created
    during the run.
    """

    name = "torchtitan_restore_process_state"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "configure"

    def apply(self, driver: Driver, recorder: PatchRecorder) -> None:
        import gc

        import torch
        import torch.distributed as dist

        had_group = dist.is_available() and dist.is_initialized()
        gc_enabled = gc.isenabled()
        multithreading = torch._C._is_multithreading_enabled()
        deterministic = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        for key in TORCHTITAN_ENV:  # unchanged now; the undo puts back what TorchTitan sets
            recorder.setenv(key, os.environ.get(key))

        def restore() -> None:
            torch.autograd.set_multithreading_enabled(multithreading)
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
            if not had_group and dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
            if gc_enabled:
                gc.enable()
            else:
                gc.disable()

        recorder.on_undo("restore gc, process group and autograd settings", restore)


@register_patch
class TorchTitanPgSetTimeout(Patch):
    """Provide ``torch.distributed.set_timeout``: TorchTitan 0.3 calls it, torch 2.13 lacks it.

    ``set_pg_timeouts`` (run after the first step) calls
    ``torch.distributed.set_timeout(timeout, group)``; torch 2.13 has the same
    operation as ``distributed_c10d._set_pg_timeout``. This binds the name for the
    run and removes it on teardown.
    """

    name = "torchtitan_pg_set_timeout"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> tuple[bool, str]:
        import torch.distributed as dist

        if hasattr(dist, "set_timeout"):
            return False, "torch.distributed.set_timeout exists"
        return True, "torch.distributed.set_timeout is missing"

    def apply(self, driver: Driver, recorder: PatchRecorder) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        recorder.setattr(dist, "set_timeout", distributed_c10d._set_pg_timeout)


#: torch releases whose ``fully_shard`` needs DTensor parameters when given mesh dims
TORCH_WITHOUT_SPMD_FSDP = ">=2.13,<2.14"


@register_patch
class TorchTitanFsdpPartialDtensor(Patch):
    """Use the ``partial_dtensor`` SPMD backend on several ranks: torch 2.13's FSDP needs it.

    TorchTitan 0.3 defaults to ``parallelism.spmd_backend = "spmd_types"``, which keeps
    parameters as plain tensors carrying SPMD annotations and hands ``fully_shard`` a
    ``DataParallelMeshDims`` whenever the dense mesh (dp_replicate x dp_shard x cp x tp)
    has more than one rank. torch 2.13's ``fully_shard`` then requires DTensor
    parameters and fails with "When dp_mesh_dims is provided, all parameters must be
    DTensors on the full SPMD mesh" (on any device). The ``partial_dtensor`` backend
    is TorchTitan's DTensor path for the same parallelisms (FSDP, HSDP, DDP, TP, CP):
    this patch selects it for multi-rank runs under those torch releases. Undo puts
    ``spmd_types`` back. Single-rank runs keep ``spmd_types`` (no mesh dims there).
    """

    name = "torchtitan_fsdp_partial_dtensor"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "configure"

    def condition(self, backend: Backend) -> tuple[bool, str]:
        import torch

        from baton.core.patches import version_matches

        config = backend.config
        if config.parallelism.spmd_backend != "spmd_types":
            return False, f"spmd_backend is {config.parallelism.spmd_backend!r}"
        torch_version = torch.__version__
        if not version_matches(TORCH_WITHOUT_SPMD_FSDP, torch_version):
            return False, f"torch {torch_version} is outside {TORCH_WITHOUT_SPMD_FSDP}"
        ranks = backend.world_size  # from the launch: the group does not exist yet
        dense = ranks // max(1, config.parallelism.pipeline_parallel_degree)
        if dense <= 1:
            return False, "one rank in the data/tensor mesh: spmd_types passes no mesh dims"
        return True, f"spmd_types with {dense} ranks in the dense mesh on torch {torch_version}"

    def apply(self, driver: Driver, recorder: PatchRecorder) -> None:
        recorder.setattr(driver.backend.config.parallelism, "spmd_backend", "partial_dtensor")


def _gloo_fsdp_modules(driver: Driver) -> list[Any]:
    """The FSDP-wrapped modules of the trainer whose gradients reduce over gloo."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    trainer = getattr(driver.backend, "trainer", None)
    found = []
    for part in getattr(trainer, "model_parts", None) or []:
        for module in part.modules():
            if not isinstance(module, FSDPModule):
                continue
            groups = module._get_fsdp_state()._fsdp_param_groups
            if any(
                dist.get_backend(group.mesh_info.shard_process_group) == "gloo"
                for group in groups
                if getattr(group.mesh_info, "shard_process_group", None) is not None
            ):
                found.append(module)
    return found


@register_patch
class TorchTitanGlooFsdpSumReduction(Patch):
    """Reduce FSDP gradients with a plain SUM on gloo: gloo has no ``PREMUL_SUM``.

    TorchTitan sets every FSDP module's gradient divide factor to 1 (it scales the
    loss by the global token count itself); FSDP2 then reduce-scatters with
    ``ReduceOp.PREMUL_SUM(1.0)``, which gloo rejects ("Cannot use
    ReduceOp.PREMUL_SUM with Gloo"). FSDP's own option
    ``set_force_sum_reduction_for_comms(True)`` makes it use ``ReduceOp.SUM`` and
    divide afterwards by the same factor (1, so the gradients are the same sums).
    Applied after the trainer is built, to the FSDP modules whose shard group is gloo;
    undo restores each module's previous setting.
    """

    name = "torchtitan_gloo_fsdp_sum_reduction"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "setup"

    def condition(self, backend: Backend) -> tuple[bool, str]:
        return _no_accelerator()

    def apply(self, driver: Driver, recorder: PatchRecorder) -> None:
        for module in _gloo_fsdp_modules(driver):
            groups = module._get_fsdp_state()._fsdp_param_groups
            before = [group.force_sum_reduction_for_comms for group in groups]
            module.set_force_sum_reduction_for_comms(True)

            def restore(groups: list[Any] = groups, before: list[bool] = before) -> None:
                for group, value in zip(groups, before, strict=True):
                    group.force_sum_reduction_for_comms = value

            recorder.on_undo(f"FSDP sum reduction on {type(module).__name__}", restore)


def _microbatch_step(schedule: Any) -> Any:
    """``schedule.step`` that also takes lists of microbatches (``arg_mbs=``,
    ``kwarg_mbs=``, ``target_mbs=``), running them through the schedule's own
    ``_step_microbatches`` after the per-iteration reset its ``step`` does."""
    original = schedule.step

    def step(
        *args: Any,
        arg_mbs: list[Any] | None = None,
        kwarg_mbs: list[Any] | None = None,
        target_mbs: list[Any] | None = None,
        losses: list[Any] | None = None,
        return_outputs: bool = True,
        loss_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return original(
                *args, losses=losses, return_outputs=return_outputs, loss_kwargs=loss_kwargs,
                **kwargs,
            )  # fmt: skip
        stages = getattr(schedule, "_stages", None) or [schedule._stage]
        for stage in stages:
            stage.has_backward = schedule._has_backward
            stage.clear_runtime_states()
        schedule._step_microbatches(
            arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs
        )
        return None

    return step


@register_patch
class TorchTitanPipelineMicrobatchStep(Patch):
    """Let torch's pipeline schedules take microbatch lists: TorchTitan 0.3 passes them.

    TorchTitan's ``pp_forward_backward_step`` calls ``pp_schedule.step(arg_mbs=...,
    kwarg_mbs=..., target_mbs=..., losses=..., loss_kwargs=...)`` with inputs already
    split into microbatches; torch 2.13's ``step(*args, target=None, ..., **kwargs)``
    takes a whole batch and would pass those lists to the model as keyword arguments
    (it fails with "Expecting 2 arg_mbs but got 1"). torch's schedules run microbatch
    lists in ``_step_microbatches``, which their ``step`` calls after resetting each
    stage: this patch gives the trainer's schedule a ``step`` that does exactly that
    for microbatch lists (and passes whole batches on unchanged). Undo removes it.
    """

    name = "torchtitan_pipeline_microbatch_step"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "setup"

    def condition(self, backend: Backend) -> tuple[bool, str]:
        import inspect

        from torch.distributed.pipelining.schedules import _PipelineSchedule

        if backend.config.parallelism.pipeline_parallel_degree <= 1:
            return False, "no pipeline parallelism"
        if "arg_mbs" in inspect.signature(_PipelineSchedule.step).parameters:
            return False, "torch's schedule.step takes microbatch lists"
        return True, "torch's schedule.step takes whole batches only"

    def apply(self, driver: Driver, recorder: PatchRecorder) -> None:
        trainer = driver.backend.trainer
        schedule = getattr(trainer, "pp_schedule", None)
        if schedule is not None:
            recorder.setattr(schedule, "step", _microbatch_step(schedule))


#: TorchTitan logs on the root logger (``torchtitan.tools.logging``)
TORCHTITAN_LOGGER = "root"


@register_patch
class TorchTitanQuiet(QuietPatch):
    """Hide TorchTitan's notes about settings baton owns (each with its reason)."""

    name = "torchtitan_quiet"
    backend = "torchtitan"
    distribution = "torchtitan"
    versions = VERSIONS
    quiet = (
        Quiet(
            "initial_load_model_only=True has no effect without an initial_load_path",
            logger=TORCHTITAN_LOGGER,
            reason="TorchTitan's own checkpoint default; baton starts from a checkpoint with "
            "--resume or --init-from, not through initial_load_path",
        ),
        Quiet(
            "model.safetensors.index.json not found at hf_assets_path",
            logger=TORCHTITAN_LOGGER,
            reason="hf_assets_path is the tokenizer's directory; the index only matters "
            "for saving TorchTitan checkpoints in Hugging Face format, which baton never "
            "does (baton export writes its own)",
        ),
        Quiet(
            "torch.distributed is already initialized. Skipping init_distributed.",
            logger=TORCHTITAN_LOGGER,
            reason="baton creates the process group from the launch before TorchTitan builds",
        ),
        Quiet(
            "Error running lspci:",
            logger=TORCHTITAN_LOGGER,
            reason="TorchTitan asks lspci for the GPU model to estimate MFU; without lspci it "
            "uses the device name, which is what baton reports",
        ),
        Quiet(
            "Peak flops undefined for: cpu,",
            logger=TORCHTITAN_LOGGER,
            reason="a CPU has no peak-flops entry: MFU on CPU means nothing either way "
            "(an unknown GPU still shows the note)",
        ),
        Quiet(
            "DTensor random operators may not have complete support on cpu device mesh",
            category=UserWarning,
            module=r"torch\.distributed\.tensor",
            reason="torch's note for a CPU mesh; baton seeds and checkpoints the RNG itself",
        ),
    )


register_patch(dcp_safe_loading("torchtitan"))
