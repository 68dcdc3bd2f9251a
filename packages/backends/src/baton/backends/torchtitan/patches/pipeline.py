"""Torch's pipeline schedules taking the microbatch lists TorchTitan 0.3 passes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.backends.torchtitan.patches.common import VERSIONS
from baton.core.patches import Patch, PatchRecorder

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView


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

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        trainer = driver.backend.trainer
        schedule = getattr(trainer, "pp_schedule", None)
        if schedule is not None:
            recorder.setattr(schedule, "step", _microbatch_step(schedule))
