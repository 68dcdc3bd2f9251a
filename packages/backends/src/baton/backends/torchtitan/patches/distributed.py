"""TorchTitan 0.3's distributed calls on torch 2.13: a process-group timeout torch
lacks, the FSDP parameters torch's ``fully_shard`` needs with mesh dims, and a gradient
reduction gloo (CPU) cannot do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.backends.torchtitan.patches.common import VERSIONS, CpuOnlyPatch
from baton.core.patches import Patch, PatchRecorder

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView


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

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        recorder.setattr(dist, "set_timeout", distributed_c10d._set_pg_timeout)


#: torch releases whose ``fully_shard`` needs DTensor parameters when given mesh dims
TORCH_WITHOUT_SPMD_FSDP = ">=2.13,<2.14"


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

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        recorder.setattr(driver.backend.config.parallelism, "spmd_backend", "partial_dtensor")


def _gloo_fsdp_modules(driver: DriverView) -> list[Any]:
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


class TorchTitanGlooFsdpSumReduction(CpuOnlyPatch):
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
    phase = "setup"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        for module in _gloo_fsdp_modules(driver):
            groups = module._get_fsdp_state()._fsdp_param_groups
            before = [group.force_sum_reduction_for_comms for group in groups]
            module.set_force_sum_reduction_for_comms(True)

            def restore(groups: list[Any] = groups, before: list[bool] = before) -> None:
                for group, value in zip(groups, before, strict=True):
                    group.force_sum_reduction_for_comms = value

            recorder.on_undo(f"FSDP sum reduction on {type(module).__name__}", restore)
