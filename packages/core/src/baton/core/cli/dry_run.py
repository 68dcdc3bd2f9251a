"""``baton run RECIPE --dry-run``: the run's parallel plan, checked, without training;
and the one error for a recipe that needs data it was not given.

The command line builds the recipe as for a run, then asks the backend for its plan
(the ``dry_run`` ability) for ``--world-size`` ranks
(default: ``$WORLD_SIZE``, else 8) instead of setting it up. While a recipe is built for
a dry run, :func:`require_data` lets it through without data, so a real-size recipe
reads::

    def recipe(data_path: str | None = None, tokenizer: str | None = None, ...) -> Driver:
        require_data("a prepared prefix or blend and its tokenizer directory",
                     data_path=data_path, tokenizer=tokenizer)
        ...
        return Driver(MegatronBackend(config), ...)

    uv run baton run recipes/megatron_llama3_8b.py --dry-run --world-size 16
    uv run baton run recipes/megatron_llama3_8b.py
    # baton: this recipe trains on real data: pass --data-path and --tokenizer (a prepared
    # prefix or blend and its tokenizer directory); --dry-run plans without them
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import contextmanager
from contextvars import ContextVar

from baton.core.abilities import ABILITY_HINTS
from baton.core.backend import Backend, offers
from baton.core.errors import DataRequired, UsageError

#: ranks a dry run plans for when neither --world-size nor $WORLD_SIZE says (one node)
DEFAULT_WORLD_SIZE = 8

_planning: ContextVar[bool] = ContextVar("baton_planning", default=False)


@contextmanager
def planning(active: bool = True) -> Generator[None]:
    """While active, the recipe being built is for a dry run (it will not train)."""
    token = _planning.set(active)
    try:
        yield
    finally:
        _planning.reset(token)


def is_planning() -> bool:
    """Whether the recipe is being built for a dry run: it may skip heavy preparation
    that only training needs (converting weights, reading data)."""
    return _planning.get()


def require_data(what: str, **flags: str | None) -> None:
    """Raise :class:`DataRequired` naming the flags without a value (``data_path`` is
    ``--data-path``) and ``what`` they take; nothing while planning a dry run."""
    missing = [f"--{name.replace('_', '-')}" for name, value in flags.items() if not value]
    if missing and not is_planning():
        raise DataRequired(
            f"this recipe trains on real data: pass {' and '.join(missing)} ({what}); "
            "--dry-run plans without them"
        )


def plan(backend: Backend, world_size: int | None = None) -> str:
    """The backend's dry run for ``world_size`` ranks (``$WORLD_SIZE``, else 8); a
    backend without the ability, or a layout that does not fit, is a usage error."""
    if not offers(backend, "dry_run"):
        raise UsageError(
            f"backend {backend.name!r} has no dry run (the dry_run ability: "
            f"{ABILITY_HINTS['dry_run']}); run the recipe without --dry-run"
        )
    ranks = world_size or int(os.environ.get("WORLD_SIZE", DEFAULT_WORLD_SIZE))
    if ranks < 1:
        raise UsageError(f"--world-size must be >= 1, got {ranks}")
    try:
        return backend.dry_run(ranks)
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(f"--dry-run for {ranks} ranks: {error}") from None
