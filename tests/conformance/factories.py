"""The backends the conformance suite runs: the example backend and every declared one
(``baton.core.backend_descriptor``: the six), each built tiny on CPU the way a user
builds it (the example's constructor, or a recipe's flags through ``build_driver``),
with an optimizer step that changes the weights and some evaluation data.

    suite_backends()                        # ["minimal", "fabric", "lightning", ...]
    backend = build("fabric", tmp_path / "run")   # not set up: a Driver does that

A backend that declares itself is in the suite; its entry in ``FACTORIES`` says how to
build it (a declared backend without one fails, naming this file).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from baton.core.backend_descriptor import backend_descriptors

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"

#: flags every recipe-built backend is given: nothing saved or evaluated by the recipe
QUIET = ["--no-progress"]


def from_recipe(recipe: str, run_dir: Path, flags: list[str]) -> Any:
    """The backend of ``recipes/<recipe>`` built with ``flags`` (its Driver is dropped:
    the suite drives the backend with its own)."""
    from baton.core.cli.recipe import build_driver

    driver = build_driver(RECIPES / recipe, [*flags, "--run-dir", str(run_dir), *QUIET])
    assert driver is not None
    return driver.backend


def minimal(run_dir: Path) -> Any:
    """``examples/minimal_backend.py``."""
    from minimal_backend import MinimalBackend, regression_batches

    return MinimalBackend(regression_batches(8), eval_batches=regression_batches(2, seed=1))


def fabric(run_dir: Path) -> Any:
    """``recipes/hf_finetune.py`` with a tiny transformers Llama made on the spot."""
    llama = run_dir.parent / "tiny-llama"  # written once, shared by the runs beside
    flags = ["--init-from", str(llama), "--make-tiny-model", "--batch-size", "2"]
    return from_recipe("hf_finetune.py", run_dir, [*flags, "--seq-len", "16"])


def lightning(run_dir: Path) -> Any:
    """``recipes/lightning_module.py``: a LightningModule's own hooks."""
    return from_recipe("lightning_module.py", run_dir, ["--batch-size", "8"])


def jax(run_dir: Path) -> Any:
    """``recipes/jax_tiny.py``: a flax nnx model through optax."""
    flags = ["--batch-size", "2", "--seq-len", "16", "--layers", "1", "--d-model", "32"]
    return from_recipe("jax_tiny.py", run_dir, flags)


def megatron(run_dir: Path) -> Any:
    """``recipes/megatron_gpt_tiny.py``: Megatron-Core's GPTModel on one CPU rank."""
    pytest.importorskip("megatron.core")
    flags = ["--batch-size", "2", "--global-batch-size", "2", "--seq-len", "16"]
    flags += ["--layers", "1", "--d-model", "32", "--warmup-steps", "1", "--no-async-save"]
    return from_recipe("megatron_gpt_tiny.py", run_dir, flags)


def torchtitan(run_dir: Path) -> Any:
    """``recipes/torchtitan_llama3_debug.py``: TorchTitan's Llama 3 debug model."""
    pytest.importorskip("torchtitan")
    flags = ["--batch-size", "2", "--seq-len", "16", "--warmup-steps", "1", "--eval-split", "0.1"]
    backend = from_recipe("torchtitan_llama3_debug.py", run_dir, flags)
    backend.config.validator.steps = 2  # the native config: two batches, not the whole split
    return backend


def maxtext(run_dir: Path) -> Any:
    """``recipes/maxtext_tiny.py``: MaxText's decoder, scanned layers, fp32."""
    pytest.importorskip("maxtext")
    flags = ["--batch-size", "2", "--seq-len", "16", "--layers", "1", "--d-model", "32"]
    flags += ["--warmup-steps", "1", "--no-async-save", "--overrides", "dtype=float32"]
    flags += [f"base_output_directory={run_dir / 'maxtext-out'}"]
    return from_recipe("maxtext_tiny.py", run_dir, flags)


#: the example backend, which no package declares
EXAMPLE = "minimal"

#: name -> build(run_dir) of a backend, not set up
FACTORIES: dict[str, Callable[[Path], Any]] = {
    "minimal": minimal,
    "fabric": fabric,
    "lightning": lightning,
    "jax": jax,
    "megatron": megatron,
    "torchtitan": torchtitan,
    "maxtext": maxtext,
}


def suite_backends() -> list[str]:
    """The example backend, then every declared backend in the order backends are listed."""
    return [EXAMPLE, *(d.name for d in backend_descriptors() if d.name != EXAMPLE)]


def build(name: str, run_dir: Path) -> Any:
    """Backend ``name`` built tiny under ``run_dir`` (not set up); a declared backend the
    suite cannot build fails, naming where its factory goes."""
    factory = FACTORIES.get(name)
    if factory is None:
        pytest.fail(
            f"backend {name!r} is declared but the conformance suite cannot build it: add "
            "a build(run_dir) for it to FACTORIES in tests/conformance/factories.py"
        )
    return factory(run_dir)
