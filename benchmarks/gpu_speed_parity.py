"""``gpu_speed.py``'s parity rows, not a speed: ``hf_finetune.py``'s first step, loss and
gradient norm, with the levers as ``auto`` picks them and with each lever off
(``PLAIN_PATH``), 4 rows in one micro-batch, the same rows, weights and seed.

Example::

    setting = Setting(Inputs(Path("/tmp/g"), TINY), "bf16-mixed", cuda=True)
    fabric_sft_parity(setting)
    # Measured(None, paths="--attention sdpa --cross-entropy full ...",
    #          parity={"loss": (6.2383, 6.2379), "grad_norm": (1.873, 1.869)})
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.gpu_speed_baton import finetune_driver
from benchmarks.gpu_speed_measure import Measured
from benchmarks.gpu_speed_setting import Setting

#: each lever's setting for the plain path (a parity row compares the levers with it)
PLAIN_PATH = {
    "attention": "sdpa",
    "cross_entropy": "full",
    "compile_layers": "off",
    "fused_optimizer": "off",
}


def plain_path_flags() -> list[str]:
    """``hf_finetune.py``'s flags that turn each of its levers off."""
    flags: list[str] = []
    for name, plain in PLAIN_PATH.items():
        flags += [f"--{name.replace('_', '-')}", plain]
    return flags


def first_step(setting: Setting, objective: str, data: Path, flags: list[str]) -> dict[str, float]:
    """The metrics ``hf_finetune.py`` logs after its first step, ``rows`` rows in one
    micro-batch, with ``flags`` added."""
    from baton.core import Callback

    logged: dict[int, dict[str, float]] = {}

    class Logged(Callback):
        def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
            logged[driver.step] = dict(metrics)

    run_dir = setting.run_dir(f"parity-{objective}")
    driver = finetune_driver(setting, objective, data, run_dir, [
        "--batch-size", str(setting.shape.rows), "--max-steps", "1", "--log-every", "1", *flags,
    ])  # fmt: skip
    driver.callbacks.append(Logged())
    driver.fit()
    return logged[1]


def parity(setting: Setting, objective: str, data: Path) -> Measured:
    """The first step's loss and gradient norm with the levers as a run picks them
    (``auto``) and with every lever off: the same rows, weights and seed."""
    plain_flags = plain_path_flags()
    fast = first_step(setting, objective, data, [])
    plain = first_step(setting, objective, data, plain_flags)
    figures = {k: (float(fast[k]), float(plain[k])) for k in ("loss", "grad_norm")}
    return Measured(None, paths=" ".join(plain_flags), parity=figures)


def fabric_sft_parity(setting: Setting) -> Measured:
    return parity(setting, "sft", setting.inputs.sft()[0])


def fabric_dpo_parity(setting: Setting) -> Measured:
    return parity(setting, "dpo", setting.inputs.pairs()[0])
