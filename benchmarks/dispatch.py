"""Dispatch overhead: the driver's own per-step cost, with 0, 1, 10 and 50 callbacks.

The backend's step does nothing (it returns one prepared ``StepOutput`` whose loss is a
0-d torch tensor, lazy as every real backend's), so the time per step is the driver's: its bookkeeping, stop checks, control flags, hook dispatch
and the log-step fetch every ``log_every`` steps. Each callback count runs twice: with
callbacks that override every hook with a no-op, and with callbacks that override
none. Target: 50 callbacks that override nothing cost the same as 0.

One more case runs the usual stack of a run (``standard_callbacks``: Checkpoint without
a cadence, Preemption, ThroughputMonitor, CompositeLogger to JSONL and TensorBoard; plus
LossGuard, EarlyStopping and TimeLimit) on the same no-op backend: the per-step cost
baton adds around a real step. Target: at most 15 us per step. It runs again with the
loss a JAX array (the JAX backends' case).

Last, the cost of one write of a log step's metrics to each file sink (JSONL,
TensorBoard), called directly: ``WRITES`` writes then ``close`` (which waits for
everything written), divided by ``WRITES``, so work a sink does on a thread of its own
is counted too.

Run alone: ``uv run python benchmarks/run.py --only dispatch``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from baton.callbacks import EarlyStopping, LossGuard, TimeLimit, standard_callbacks
from baton.callbacks.sinks import build_sink
from baton.core import HOOKS, BackendBase, Callback, Driver, StepOutput
from baton.core.dispatch import overrides
from benchmarks.harness import Row, at_most, interleave, median, paired_ratio

NAME = "dispatch"
COUNTS = (1, 10, 50)
#: 50 callbacks overriding nothing may cost at most this much more than none (noise margin)
TARGET = 1.05
LOG_EVERY = 10
#: on_step_start and on_step_end every step, on_log every LOG_EVERY steps
HOOK_CALLS_PER_STEP = 2 + 1 / LOG_EVERY
STACK = "standard stack + LossGuard, EarlyStopping, TimeLimit"
STACK_JAX = f"{STACK} (JAX loss)"
#: the standard stack's per-step cost on a no-op backend, microseconds
STACK_TARGET_US = 15.0
#: file sinks whose cost per write is measured, and what one log step writes to them
SINKS = ("jsonl", "tensorboard")
LOG_STEP_METRICS = {
    "loss": 2.3125,
    "lr": 1e-3,
    "grad_norm": 0.75,
    "tokens": 40960.0,
    "samples": 80.0,
    "train_time_s": 12.5,
    "throughput/tokens_per_s": 51200.0,
    "throughput/samples_per_s": 100.0,
    "throughput/step_time_s": 0.08,
    "throughput/mfu": 0.41,
}


def lazy_loss(framework: str) -> Any:
    """A 0-d loss as a backend of ``framework`` returns it: a torch tensor or a JAX array."""
    if framework == "jax":
        import jax.numpy as jnp

        return jnp.asarray(2.0, dtype=jnp.float32)
    import torch

    return torch.tensor(2.0)


class NullBackend(BackendBase):
    """A real backend whose step does no work: what remains is the driver's cost."""

    name = "null"

    def __init__(self, framework: str = "torch") -> None:
        self._output = StepOutput(loss=lazy_loss(framework), tokens=1, samples=1)

    def setup(self) -> None:
        pass

    def train_step(self, step: int) -> StepOutput:
        return self._output


class OverridesNothing(Callback):
    """A callback that inherits every hook's no-op (the driver should never call it)."""


def _noop(self: Callback, *args: Any) -> None:
    return None


#: A callback whose class overrides every hook with a no-op (the driver calls them all).
OverridesEverything = type(
    "OverridesEverything", (Callback,), {hook: _noop for hook in HOOKS} | {"__doc__": "no-ops"}
)
assert all(overrides(OverridesEverything(), hook) for hook in HOOKS)


def seconds_per_step(
    callbacks: list[Callback], steps: int, run_dir: Path, framework: str = "torch"
) -> float:
    """Train ``steps`` no-op steps; the driver's own clock gives the loop time."""
    backend = NullBackend(framework)
    driver = Driver(backend, callbacks, max_steps=steps, log_every=LOG_EVERY, run_dir=run_dir)
    result = driver.fit()
    assert result.step == steps, result
    return result.train_time_s / steps


def standard_stack() -> list[Callback]:
    """What a recipe runs, minus what needs a terminal or a real save."""
    return standard_callbacks(
        save_on_stop=False,
        sinks=("jsonl", "tensorboard"),
        console_keys=None,
        progress=False,
        extra=[LossGuard(), EarlyStopping(monitor="loss", patience=10**9), TimeLimit(600)],
    )


def seconds_per_write(sink_name: str, writes: int, run_dir: Path) -> float:
    """``writes`` log steps' metrics to a fresh sink, then ``close``: the time per write."""
    import time

    sink = build_sink(sink_name)
    sink.open(Driver(NullBackend(), [], max_steps=1, run_dir=run_dir))
    started = time.perf_counter()
    for step in range(1, writes + 1):
        sink.write(step, dict(LOG_STEP_METRICS), "train")
    sink.close()
    return (time.perf_counter() - started) / writes


def run(quick: bool = False) -> list[Row]:
    steps, rounds = (300, 2) if quick else (5_000, 25)
    writes = 50 if quick else 1_000
    with tempfile.TemporaryDirectory(prefix="baton-bench-dispatch-") as tmp:
        run_dir = Path(tmp)
        cases = {"0 callbacks": lambda: seconds_per_step([], steps, run_dir)}
        for n in COUNTS:
            cases[f"{n} overriding no hook"] = lambda n=n: seconds_per_step(
                [OverridesNothing() for _ in range(n)], steps, run_dir
            )
            cases[f"{n} overriding every hook"] = lambda n=n: seconds_per_step(
                [OverridesEverything() for _ in range(n)], steps, run_dir
            )
        cases[STACK] = lambda: seconds_per_step(standard_stack(), steps, run_dir)
        cases[STACK_JAX] = lambda: seconds_per_step(standard_stack(), steps, run_dir, "jax")
        for sink in SINKS:
            cases[_sink_case(sink)] = lambda sink=sink: seconds_per_write(
                sink, writes, run_dir / sink
            )
        samples = interleave(cases, rounds=rounds)

    base = samples["0 callbacks"]
    rows = [Row(NAME, "0 callbacks", median(base) * 1e6, "us/step", note=f"{steps} steps")]
    for name, values in samples.items():
        if name == "0 callbacks":
            continue
        if name in {_sink_case(sink) for sink in SINKS}:
            rows.append(
                Row(
                    NAME,
                    name,
                    median(values) * 1e6,
                    "us/write",
                    note=f"{len(LOG_STEP_METRICS)} metrics, {writes} writes then close",
                )
            )
            continue
        if name in (STACK, STACK_JAX):
            us = median(values) * 1e6
            rows.append(
                Row(
                    NAME,
                    name,
                    us,
                    "us/step",
                    ratio=paired_ratio(values, base),
                    baseline="0",
                    target=f"<= {STACK_TARGET_US:g} us",
                    passed=at_most(us, STACK_TARGET_US),
                    note="no-op backend: the driver and callbacks only",
                )
            )
            continue
        ratio = paired_ratio(values, base)
        gated = name == f"{max(COUNTS)} overriding no hook"
        note = ""
        if "every hook" in name:
            n = int(name.split()[0])
            calls = n * HOOK_CALLS_PER_STEP
            note = f"{(median(values) - median(base)) / calls * 1e9:.0f} ns per hook call"
        rows.append(
            Row(
                NAME,
                name,
                median(values) * 1e6,
                "us/step",
                ratio=ratio,
                baseline="0",
                target=f"<= {TARGET}" if gated else "",
                passed=at_most(ratio, TARGET) if gated else None,
                note=note,
            )
        )
    return rows


def _sink_case(sink: str) -> str:
    return f"{sink} sink: one log write"
