"""The ``gradients`` ability for the torch backends: watchers see each parameter's
gradient before the optimizer step (after backward and, with accumulation, after the
window's last backward; before clipping).

Example::

    backend.watch_gradients(lambda grads: print(sorted(grads)))   # {"net.0.weight": tensor}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

Watcher = Callable[[Mapping[str, Any]], None]


class GradientWatchers:
    """Mixed into a backend: ``watch_gradients`` registers, ``show_gradients`` calls."""

    _gradient_watchers: list[Watcher]

    def watch_gradients(self, watcher: Watcher) -> None:
        """Call ``watcher({name: gradient})`` before every optimizer step from now on."""
        if "_gradient_watchers" not in self.__dict__:
            self._gradient_watchers = []
        self._gradient_watchers.append(watcher)

    def show_gradients(self, module: nn.Module) -> None:
        """The gradients of ``module``'s parameters to every watcher (nothing if none)."""
        watchers = self.__dict__.get("_gradient_watchers")
        if not watchers:
            return
        grads = {name: p.grad for name, p in module.named_parameters() if p.grad is not None}
        for watcher in watchers:
            watcher(grads)
