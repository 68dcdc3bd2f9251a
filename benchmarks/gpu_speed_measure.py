"""How ``gpu_speed.py`` measures a row: the timed window of steps, the figures a row gives
(``Measured``) and what its line reports (``Result``: seconds a step, ratios, MFU, peak
memory, the paths it ran), the FLOPs a token costs and the devices' datasheet peaks.

Example::

    window = Window(first=4, last=15)   # one synchronisation at each edge, none between
    for step in range(1, 16):
        window.begin(step - 1)
        train_step()
        window.end(step)
    measured = Measured(window.per_step(), tokens=4 * 4096, flops_per_token=3.7e9)
    result = measure_row("fabric-sft-1x4", "baton Fabric SFT", lambda: measured,
                         peak=peak_tflops("NVIDIA H200", None), baselines={})
    result.mfu      # tokens x FLOPs a token / seconds a step / 989 TFLOP/s
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_speed_inputs import Decoder
from benchmarks.harness import Skip

#: datasheet dense bf16 peaks, TFLOP/s, by a part of the device's name (first match)
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
)
#: the settings a run records for the paths it took (``fast_paths`` a dict of them)
PATH_SETTINGS = ("attention", "cross_entropy", "compile_layers", "fused_optimizer")


# -- timing ---------------------------------------------------------------------------------
def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Window:
    """The wall time of steps ``first``..``last``: one device synchronisation at each edge."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self._start: float | None = None
        self.seconds: float | None = None

    def begin(self, completed: int) -> None:
        """Before a step, ``completed`` steps done: opens the window before ``first``."""
        if completed == self.first - 1:
            synchronize()
            self._start = time.perf_counter()

    def end(self, completed: int) -> None:
        """After a step: closes the window after ``last``."""
        if completed == self.last and self._start is not None:
            synchronize()
            self.seconds = time.perf_counter() - self._start

    def per_step(self) -> float:
        if self.seconds is None:
            raise RuntimeError(f"the run did not reach step {self.last}: nothing timed")
        return self.seconds / (self.last - self.first + 1)


def baton_timer(window: Window) -> Any:
    """A baton callback that times ``window`` over the driver's steps."""
    from baton.core import Callback

    class Timed(Callback):
        priority = 10**9  # after every other callback's work of the step

        def on_step_start(self, driver: Any) -> None:
            window.begin(driver.step)

        def on_step_end(self, driver: Any, output: Any) -> None:
            window.end(driver.step)

    return Timed()


def trl_timer(window: Window) -> Any:
    """A ``transformers`` trainer callback that times ``window`` over the trainer's steps."""
    from transformers import TrainerCallback

    class Timed(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            window.begin(state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            window.end(state.global_step)

    return Timed()


# -- what a row measured --------------------------------------------------------------------
@dataclass
class Measured:
    """One row's figures (``tokens`` a step and ``flops_per_token`` for MFU, if known)."""

    seconds_per_step: float | None
    tokens: int | None = None
    flops_per_token: float | None = None
    paths: str = "n/a"
    note: str = ""
    #: a parity row's first-step figures: {"loss", "grad_norm"} -> (levers, plain path)
    parity: dict[str, tuple[float, float]] | None = None


@dataclass
class Result:
    name: str
    title: str
    seconds_per_step: float | None = None
    mfu: float | None = None
    peak_memory_gib: float | None = None
    paths: str = "n/a"
    ratios: dict[str, float] = field(default_factory=dict[str, float])
    note: str = ""
    error: str | None = None
    skipped: str | None = None
    #: a parity row's relative differences, levers against the plain path
    parity: dict[str, float] | None = None


# -- FLOPs and the device's peak ------------------------------------------------------------
def training_flops_per_token(model: Decoder, parameters: int, seq_len: int) -> float:
    """6 x parameters + causal attention's 6 x layers x seq_len x attention width."""
    return 6.0 * parameters + 6.0 * model.layers * seq_len * model.attention_width


def parameter_count(config_dir: Path) -> int:
    """Parameters of the ``transformers`` model of ``config_dir`` (built on the meta
    device: tied embeddings count once)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model: Decoder, config_dir: Path, seq_len: int) -> float:
    """``training_flops_per_token`` of the model of shape ``model`` saved in ``config_dir``."""
    return training_flops_per_token(model, parameter_count(config_dir), seq_len)


def peak_tflops(device_name: str, override: float | None) -> float | None:
    if override is not None:
        return override
    for part, peak in PEAK_TFLOPS:
        if part in device_name:
            return peak
    return None


# -- the paths a row ran --------------------------------------------------------------------
def recorded_paths(*settings: dict[str, Any]) -> str:
    """The paths a baton run recorded (its settings' ``fast_paths``: the attention, the
    compiled layers, the fused optimizer, the cross entropy each run took), ``key=value``
    joined; ``n/a`` where none is recorded."""
    found: dict[str, Any] = {}
    for recorded in settings:
        nested = recorded.get("fast_paths")
        if isinstance(nested, dict):
            found.update(nested)
    return " ".join(f"{k}={v}" for k, v in found.items()) or "n/a"


def hf_paths(model: Any, **more: Any) -> str:
    """A ``transformers`` model's attention implementation and ``more``, ``key=value``."""
    attention = getattr(model.config, "_attn_implementation", None) or "n/a"
    return " ".join(f"{k}={v}" for k, v in {"attention": attention, **more}.items())


# -- one row, measured ----------------------------------------------------------------------
def measure_row(
    name: str,
    title: str,
    row: Callable[[], Measured],
    *,
    peak: float | None,
    baselines: dict[str, Result],
) -> Result:
    """Runs ``row`` isolated: its error becomes its result; the device is cleaned after
    it. Its time is compared with each of ``baselines`` (in their order) that has one."""
    import torch

    cuda = torch.cuda.is_available()
    result = Result(name, title)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        measured = row()
    except Skip as reason:
        result.skipped = str(reason)
    except Exception as error:  # one row failing leaves the others
        traceback.print_exc()
        first = (str(error).strip().splitlines() or [""])[0][:300]
        result.error = f"{type(error).__name__}: {first}"
    else:
        _report(result, measured, peak, baselines)
    if cuda:
        result.peak_memory_gib = torch.cuda.max_memory_allocated() / 2**30
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def _report(
    result: Result, measured: Measured, peak: float | None, baselines: dict[str, Result]
) -> None:
    """``measured``'s figures into ``result``: MFU, the ratios, a parity row's differences."""
    seconds = result.seconds_per_step = measured.seconds_per_step
    result.paths, result.note = measured.paths, measured.note
    if seconds and peak is not None and measured.tokens and measured.flops_per_token:
        result.mfu = measured.tokens * measured.flops_per_token / seconds / (peak * 1e12)
    for other, base in baselines.items():
        if seconds and base.seconds_per_step:
            result.ratios[other] = seconds / base.seconds_per_step
    if measured.parity is not None:
        result.note = ", ".join(
            f"{k} {fast:.6g} vs plain {plain:.6g}" for k, (fast, plain) in measured.parity.items()
        )
        result.parity = {
            k: abs(fast - plain) / max(abs(plain), 1e-12)
            for k, (fast, plain) in measured.parity.items()
        }
