"""Helpers for the MaxText tests: what baton's patches do for a Driver run (for MaxText
code a test calls directly), and a record of the kind of save a backend returned."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def outside_driver(config: Any = None) -> Iterator[None]:
    """No HLO dump (MaxText fills an empty XLA_FLAGS with dump flags) and JAX's PRNG
    implementation restored afterwards (MaxText's config init changes it). Given the
    baton run's ``MaxTextConfig``, MaxText's own loop builds the learning-rate schedule
    that run trained with (baton's shape where ``warmup_steps`` is set), so a parity
    reference differs from baton's run in nothing but the loop."""
    import jax

    from baton.backends.maxtext.lr_schedule import baton_schedule
    from baton.backends.maxtext.patches import NO_DUMP_XLA_FLAGS

    warmup = getattr(config, "warmup_steps", None)
    decay = getattr(config, "lr_schedule", "cosine")
    schedule = baton_schedule(warmup, decay) if warmup is not None else contextlib.nullcontext()
    prng, flags = jax.config.jax_default_prng_impl, os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = flags or NO_DUMP_XLA_FLAGS
    try:
        with schedule:
            yield
    finally:
        jax.config.update("jax_default_prng_impl", prng)
        if flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = flags


def record_save_handles(backend: Any) -> list[str]:
    """The kind of pending save each ``backend.save`` returns from now on, by class name
    (``NoneType``: a synchronous save)."""
    handles: list[str] = []
    save = backend.save

    def recorded(directory: Path, **kwargs: Any) -> Any:
        handle = save(directory, **kwargs)
        handles.append(type(handle).__name__)
        return handle

    backend.save = recorded
    return handles


@contextlib.contextmanager
def in_background(command: list[str], cwd: Path) -> Iterator[Any]:
    """``command`` (a fresh process, e.g. a recipe's ``--dry-run``) running while the
    module's other tests do (JAX picks its platform itself; one thread); killed after."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["OMP_NUM_THREADS"] = "1"
    process = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
