"""A recipe that builds on another and keeps every flag of it: ``@extends``.

The wrapped recipe runs with the flags it takes; its ``Driver`` is handed to the new
recipe's function (its first parameter), which changes it and returns it. The command
line is the wrapped recipe's flags, with their help, plus the new function's own::

    # recipes/llama3_embed_norm.py
    from baton.core import Driver
    from baton.core.cli.recipe_extension import extends
    from my_callbacks import EmbedNorm

    @extends("torchtitan_llama3_debug.py")
    def recipe(driver: Driver, scale: float = 2.0) -> Driver:
        '''TorchTitan's debug Llama with the embedding norm kept in check.

        Args:
            scale: the norm EmbedNorm keeps the embeddings at.
        '''
        driver.callbacks.append(EmbedNorm(scale))
        return driver

    # baton run recipes/llama3_embed_norm.py --max-steps 20 --scale 3 --help

The path is the wrapped recipe's file, relative to the new recipe's folder (else to
the working directory). A parameter the new function shares with the wrapped recipe
goes to both, with the new function's default. ``baton run --help`` reads both
signatures from source (``recipe_signature.read_signature``): no framework is imported
until the run starts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from baton.core.cli.recipe_signature import (
    Signature,
    base_recipe_path,
    extend_signature,
    read_signature,
    signature_of,
)


class ExtendedRecipe:
    """The wrapped recipe, then ``function(driver, **own flags)``: what ``@extends``
    returns. ``recipe_signature`` is every flag, the wrapped recipe's first."""

    def __init__(self, function: Callable[..., Any], base: Path) -> None:
        self.function = function
        self.base = base
        self.__doc__ = function.__doc__

    @property
    def recipe_signature(self) -> Signature:
        return extend_signature(self._base_signature(), _own_signature(self.function))

    def _base_signature(self) -> Signature:
        found = read_signature(self.base)
        return found if found is not None else signature_of(self._base_function())

    def _base_function(self) -> Callable[..., Any]:
        from baton.core.cli.recipe import load_recipe  # the recipe module imports this one

        return load_recipe(self.base)

    def __call__(self, **flags: Any) -> Any:
        base_names = {p.name for p in self._base_signature().params}
        own_names = {p.name for p in _own_signature(self.function).params}
        driver = self._base_function()(**{k: v for k, v in flags.items() if k in base_names})
        return self.function(driver, **{k: v for k, v in flags.items() if k in own_names})


def extends(base: str | Path) -> Callable[[Callable[..., Any]], ExtendedRecipe]:
    """Decorate ``recipe(driver, **own flags)`` to run after the recipe in ``base``."""

    def decorate(function: Callable[..., Any]) -> ExtendedRecipe:
        folder = Path(inspect.getfile(function)).parent
        return ExtendedRecipe(function, base_recipe_path(base, folder))

    return decorate


def _own_signature(function: Callable[..., Any]) -> Signature:
    """The function's flags: its parameters after the first (the driver)."""
    return signature_of(function, skip=1)


__all__ = ["ExtendedRecipe", "extends"]
