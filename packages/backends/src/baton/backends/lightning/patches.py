"""The LightningModule backend's patches: Fabric's (quiet, no NVML retry), registered
under its name; ``self.log``'s signature check done once per function, and a repeated
``self.log`` call going straight to its update.

A LightningModule runs through Lightning Fabric, so the messages Fabric prints are the
same as under the ``fabric`` backend (``baton.backends.fabric.patches``). This module
imports neither torch nor lightning (``baton patches`` lists them without a framework).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from baton.backends.fabric.patches import FabricNoNvmlRetry, FabricQuiet
from baton.core.patches import Patch, PatchRecorder, register_patch

if TYPE_CHECKING:
    from baton.core.driver_view import DriverView


@register_patch
class LightningQuiet(FabricQuiet):
    """Hide Lightning's process-group banner on multi-process runs (each with its reason)."""

    name = "lightning_quiet"
    backend = "lightning"


@register_patch
class LightningNoNvmlRetry(FabricNoNvmlRetry):
    """On a host without an NVIDIA driver, stop torch retrying to load NVML at each step."""

    name = "lightning_no_nvml_retry"
    backend = "lightning"


@register_patch
class LightningLogSignature(Patch):
    """Read ``training_step``'s signature once per function in ``self.log``, not per call."""

    # ``LightningModule.log`` asks on every call, while training, whether the module's
    # ``training_step`` declares ``dataloader_iter`` (``is_param_in_hook_signature``: an
    # ``inspect.getfullargspec`` of the bound method, about a third of ``self.log``'s
    # time). A function's signature does not change, so the answer is kept per function
    # (a module that assigns another ``training_step`` is asked again); the undo restores
    # Lightning's function when the run ends.

    name = "lightning_log_signature"
    backend = "lightning"
    versions = ">=2.6,<2.7"
    phase = "setup"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        from lightning.pytorch.core import module

        recorder.setattr(
            module,
            "is_param_in_hook_signature",
            signature_answers_kept(module.is_param_in_hook_signature),
        )


@register_patch
class LightningLogFastPath(Patch):
    """A ``self.log`` call Lightning accepted once goes straight to its update when repeated."""

    # ``LightningModule.log`` re-validates every call (the value's type, the hook's levels,
    # the name, the stored metadata), about half of its time, before the steps that depend
    # on the value. Under baton's TrainerView a call already accepted (same hook, name and
    # arguments, the same stored metric, a scalar tensor) runs only those steps, with
    # Lightning's functions (``log_fast_path``); a module under a Lightning ``Trainer``, a
    # first call or any other value goes through Lightning's ``log``. The undo restores it.

    name = "lightning_log_fast_path"
    backend = "lightning"
    versions = ">=2.6,<2.7"
    phase = "setup"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        from lightning.pytorch.core.module import LightningModule

        from baton.backends.lightning.log_fast_path import log_with_fast_path

        recorder.setattr(LightningModule, "log", log_with_fast_path(LightningModule.log))


def signature_answers_kept(ask: Callable[..., bool]) -> Callable[..., bool]:
    """``ask(hook, param, explicit, min_args)`` answered once per (function, question).

    >>> calls = []
    >>> def ask(hook, param, explicit=False, min_args=None):
    ...     calls.append(param)
    ...     return True
    >>> kept = signature_answers_kept(ask)
    >>> kept(len, "x"), kept(len, "x"), calls
    (True, True, ['x'])
    """
    answers: dict[tuple[Any, str, bool, int | None], bool] = {}

    def kept(
        hook_fx: Callable[..., Any],
        param: str,
        explicit: bool = False,
        min_args: int | None = None,
    ) -> bool:
        key = (getattr(hook_fx, "__func__", hook_fx), param, explicit, min_args)
        answer = answers.get(key)
        if answer is None:
            answer = answers[key] = ask(hook_fx, param, explicit, min_args)
        return answer

    return kept
