"""``gpu_speed.py``'s rows of baton's own recipes, each built by ``build_driver`` as the
command line would and timed by a callback: Fabric SFT (``hf_finetune.py``, one row per
micro-batch and 4 accumulated, or 4 rows in one), Fabric DPO (the reference precomputed)
and Megatron-Core (``megatron_llama3_8b.py`` with a small Llama ``--model-config``).

Example::

    setting = Setting(Inputs(Path("/tmp/g"), TINY), "32-true", cuda=False)
    fabric_sft_1x4(setting)   # Measured(seconds_per_step=0.02, tokens=512, ...,
                              #          paths="attention=sdpa cross_entropy=full ...")
    megatron(setting)         # Measured(..., paths="layers=local")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.gpu_speed_inputs import Inputs
from benchmarks.gpu_speed_measure import (
    Measured,
    baton_timer,
    flops_per_token,
    recorded_paths,
)
from benchmarks.gpu_speed_setting import LR, Setting

ROOT = Path(__file__).resolve().parent.parent
FINETUNE = ROOT / "recipes" / "hf_finetune.py"
MEGATRON = ROOT / "recipes" / "megatron_llama3_8b.py"


def without_checkpoints(driver: Any) -> Any:
    """``driver`` with its checkpoint callback left out (a row saves nothing)."""
    driver.callbacks = [c for c in driver.callbacks if type(c).__name__ != "Checkpoint"]
    return driver


def finetune_driver(setting: Setting, objective: str, data: Path, run_dir: Path,
                    flags: list[str]) -> Any:  # fmt: skip
    """``hf_finetune.py --objective objective`` on the setting's Qwen3 and ``data``, no
    evaluation, no checkpoint, no progress bar; ``flags`` set the batch and the steps."""
    from baton.core.cli.recipe import build_driver

    inputs = setting.inputs
    driver = build_driver(FINETUNE, [
        "--objective", objective, "--init-from", str(inputs.qwen3()),
        "--tokenizer", str(inputs.tokenizer), "--data-path", str(data),
        "--accelerator", setting.accelerator, "--precision", setting.precision,
        "--lr", str(LR), "--eval-every", "0", "--save-every", "0", "--no-progress",
        "--run-dir", str(run_dir), *flags,
    ])  # fmt: skip
    assert driver is not None
    return without_checkpoints(driver)


# -- Fabric ---------------------------------------------------------------------------------
def fabric(setting: Setting, objective: str, data: Path, batch_size: int,
           grad_accum: int) -> Measured:  # fmt: skip
    """Fabric's seconds a step at ``batch_size`` rows x ``grad_accum`` micro-batches, and
    the paths its run recorded."""
    shape, window, run_dir = setting.shape, setting.window(), setting.run_dir(f"fabric-{objective}")
    driver = finetune_driver(setting, objective, data, run_dir, [
        "--batch-size", str(batch_size), "--grad-accum", str(grad_accum),
        "--max-steps", str(shape.steps), "--log-every", str(shape.steps),
    ])  # fmt: skip
    driver.callbacks.append(baton_timer(window))
    driver.fit()
    record = run_dir / "run.json"
    recorded = json.loads(record.read_text()) if record.exists() else {}
    paths = recorded_paths(
        recorded.get("settings", {}), recorded.get("backend", {}), driver.options.settings
    )
    flops = flops_per_token(shape.qwen3, setting.inputs.qwen3(), shape.seq_len)
    return Measured(window.per_step(), shape.step_tokens, flops, paths)


def fabric_sft_1x4(setting: Setting) -> Measured:
    return fabric(setting, "sft", setting.inputs.sft()[0], 1, setting.shape.rows)


def fabric_sft_4x1(setting: Setting) -> Measured:
    return fabric(setting, "sft", setting.inputs.sft()[0], setting.shape.rows, 1)


def fabric_dpo(setting: Setting) -> Measured:
    measured = fabric(setting, "dpo", setting.inputs.pairs()[0], setting.shape.rows, 1)
    measured.note = f"{setting.shape.pairs} pairs a step, reference precomputed"
    return measured


# -- Megatron-Core --------------------------------------------------------------------------
def megatron_driver(setting: Setting) -> Any:
    """``megatron_llama3_8b.py`` on the setting's Llama, 1 x ``rows`` micro-batches of
    ``seq_len`` a step, logging once (the last step), no evaluation, no checkpoint."""
    from baton.core.cli.recipe import build_driver

    shape, inputs = setting.shape, setting.inputs
    driver = build_driver(MEGATRON, [
        "--model-config", str(inputs.llama()), "--tp", "1",
        "--seq-len", str(shape.seq_len), "--batch-size", "1",
        "--global-batch-size", str(shape.rows), "--max-steps", str(shape.steps),
        "--lr", str(LR), "--data-path", str(inputs.pretraining()),
        "--tokenizer", str(inputs.tokenizer), "--save-every", "0",
        "--set", "data.split=100,0,0",  # all of it trains: nothing is evaluated
        "--run-dir", str(setting.run_dir("megatron")),
    ])  # fmt: skip
    assert driver is not None
    driver = without_checkpoints(driver)
    driver.options = driver.options.replace(log_every=shape.steps, eval_every=0)
    return driver


def megatron_measured(inputs: Inputs, seconds: float, backend: Any) -> Measured:
    """A Megatron-Core row's figures: its seconds a step, the Llama's FLOPs and the
    layers its backend built (``local`` or ``transformer_engine``)."""
    from baton.backends.megatron.build import layer_choice

    shape = inputs.shape
    flops = flops_per_token(shape.llama, inputs.llama(), shape.seq_len)
    layers = layer_choice(backend.config)
    return Measured(seconds, shape.step_tokens, flops, f"layers={layers}")


def megatron(setting: Setting) -> Measured:
    window, driver = setting.window(), megatron_driver(setting)
    driver.callbacks.append(baton_timer(window))
    driver.fit()
    return megatron_measured(setting.inputs, window.per_step(), driver.backend)
