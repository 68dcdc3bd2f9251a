"""Lightning hooks called as ``Trainer.fit`` calls them, minus the calls that do nothing.

``Trainer.fit`` calls every hook of every callback and of the module at each point of its
loop, each with ``module._current_fx_name`` set to the hook's name (``self.log`` reads it),
whether or not anything overrides the hook. ``Hooks`` calls the same hooks in the same
order with the same arguments, and leaves out only the calls that cannot do anything: a
hook of ``NO_OP_HOOKS`` (whose ``LightningModule`` and ``Callback`` implementations are
empty) on an object that does not override it. It also sets ``_current_fx_name`` without
``torch.nn.Module.__setattr__``'s parameter, buffer and submodule checks (a hook's name is
none of those). On a small model's step this is tens of Python calls fewer per hook.

Example::

    hooks = Hooks(module, callbacks, trainer)
    hooks("on_train_batch_start", batch, batch_idx)   # callbacks', then the module's
    hooks.module_hook("optimizer_zero_grad", epoch, batch_idx, optimizer)
    previous = hooks.fx_name("training_step")         # self.log in it reads the name
    try:
        output = model.training_step(batch, batch_idx)
    finally:
        hooks.restore_fx_name(previous)
"""

from __future__ import annotations

from typing import Any

import torch

#: hooks whose ``LightningModule`` and ``lightning.pytorch.Callback`` implementations are
#: empty: a call to one that the object does not override does nothing and is skipped
NO_OP_HOOKS = frozenset(
    {
        "on_fit_start",
        "on_fit_end",
        "on_train_start",
        "on_train_end",
        "on_train_epoch_start",
        "on_train_epoch_end",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_validation_start",
        "on_validation_end",
        "on_validation_epoch_start",
        "on_validation_epoch_end",
        "on_validation_batch_start",
        "on_validation_batch_end",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
    }
)


class Hooks:
    """The callbacks' and the module's hooks of one run (see the module docs).

    Which objects override a hook is read on the hook's first call, after the module
    and callbacks are set up, and kept for the run.
    """

    def __init__(self, module: Any, callbacks: list[Any], trainer: Any) -> None:
        self.module = module
        self.callbacks = callbacks
        self.trainer = trainer
        #: ``nn.Module.__setattr__`` can be bypassed: the module's class does not replace it
        self._plain_setattr = type(module).__setattr__ is torch.nn.Module.__setattr__
        self._callers: dict[str, tuple[list[Any], bool]] = {}
        self._overrides: dict[tuple[str, ...], bool] = {}

    def __call__(self, name: str, *args: Any) -> Any:
        """Callbacks' ``name(trainer, module, *args)``, then the module's ``name(*args)``
        (its result returned); ``None`` where the module's call was left out."""
        callbacks, module_runs = self._callers.get(name) or self._find_callers(name)
        for callback in callbacks:
            getattr(callback, name)(self.trainer, self.module, *args)
        return self.module_hook(name, *args) if module_runs else None

    def module_hook(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The module's hook ``name`` with ``_current_fx_name`` set to it meanwhile."""
        previous = self.fx_name(name)
        try:
            return getattr(self.module, name)(*args, **kwargs)
        finally:
            self.restore_fx_name(previous)

    def fx_name(self, name: str) -> str | None:
        """Set ``module._current_fx_name`` to ``name``; return the previous one."""
        module = self.module
        previous = module._current_fx_name
        if self._plain_setattr:
            # a str is not a parameter, buffer or submodule: nn.Module.__setattr__ would end
            # in object.__setattr__ after a dozen checks (the hot path of every hook call)
            object.__setattr__(module, "_current_fx_name", name)
        else:
            module._current_fx_name = name
        return previous

    def restore_fx_name(self, previous: str | None) -> None:
        """Put back the name ``fx_name`` returned."""
        if self._plain_setattr:
            object.__setattr__(self.module, "_current_fx_name", previous)
        else:
            self.module._current_fx_name = previous

    def overridden(self, name: str) -> bool:
        """Whether a call of hook ``name`` does anything (always, outside ``NO_OP_HOOKS``)."""
        callbacks, module_runs = self._callers.get(name) or self._find_callers(name)
        return module_runs or bool(callbacks)

    def module_overrides(self, *names: str) -> bool:
        """Whether the module overrides one of the ``LightningModule`` methods ``names``."""
        found = self._overrides.get(names)
        if found is None:
            import lightning.pytorch as pl

            found = any(_overrides(self.module, n, pl.LightningModule) for n in names)
            self._overrides[names] = found
        return found

    def _find_callers(self, name: str) -> tuple[list[Any], bool]:
        if name not in NO_OP_HOOKS:
            callers = (list(self.callbacks), True)
        else:
            import lightning.pytorch as pl

            callers = (
                [c for c in self.callbacks if _overrides(c, name, pl.Callback)],
                _overrides(self.module, name, pl.LightningModule),
            )
        self._callers[name] = callers
        return callers


def _overrides(obj: Any, name: str, parent: type) -> bool:
    """Lightning's ``is_overridden`` (a method of the class or one set on the instance);
    ``True`` where it cannot tell (a callable without code, such as a builtin)."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    try:
        return is_overridden(name, obj, parent)
    except (AttributeError, ValueError):
        return True
