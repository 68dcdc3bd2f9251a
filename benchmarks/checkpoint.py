"""Checkpoint blocking: how long a save stops the step loop, synchronous vs async.

For each backend, a model whose checkpoint (weights + optimizer state) is at least
100 MB trains a few steps. Two first saves (``WARMUP_SAVES``) are waited for and not
timed: they pay what a run pays once (a writer process started, save plans built,
sharding validated, and, for Megatron-Core, the cached plan checked against the second
save's before the third uses it). The timed save (``SAVE_AT``) is the steady state of a
run that saves many times. The loop is blocked for the gap between that step's ``on_step_end``
and the next step's ``on_step_start``, less the gap of an ordinary step. Every step's
device work is waited for before its end is stamped (one ``fetch`` of its metrics),
so a save never absorbs a step still in flight (JAX and CUDA dispatch
asynchronously). Synchronous and asynchronous runs alternate; where the backend does
not support async save (``async_save`` not in ``abilities()``, read after setup) the row
says so. Target: async blocks for under 10% of the synchronous time. The note also
gives how much longer the step after the save took than an ordinary step (a backend
may finish its staging copy there, and the writer competes for the cores).

Adding a backend is one ``Entry`` in ``BACKENDS``: a function ``(quick, scratch,
asynchronous) -> Backend`` building a backend whose state is >= 100 MB (``scratch`` is
a directory for its data caches; ``asynchronous`` says which case it is built for),
with its rounds and whether ``--quick`` runs it. Entries whose module is missing are
reported as skipped; heavy backends are skipped under ``--quick``.

Run alone: ``uv run python benchmarks/run.py --only checkpoint``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.core import Callback, Driver
from baton.core.checkpoints import files as ckpt
from benchmarks.harness import Row, at_most, interleave, median, paired_ratio, skipped

NAME = "checkpoint"
MIN_STATE_MB = 100
#: async save may block the loop for at most this fraction of the synchronous save
TARGET = 0.1
#: saves waited for and not timed: they pay each backend's one-time costs (a writer
#: process or thread started, save plans built and cached, sharding validated).
#: Megatron-Core reuses its cached save plan only from a process's third save on (the
#: second checks that its plan equals the first's)
WARMUP_SAVES = (2, 3)  # the optimizer state exists after the first step
#: the timed save: the steady state of a run that saves many times
SAVE_AT = 5
STEPS = SAVE_AT + 2


def fabric_backend(quick: bool, scratch: Path, asynchronous: bool) -> Any:
    """A GPT whose weights + AdamW state are ~150 MB (quick: ~2 MB)."""
    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining

    model = (
        GPTConfig(n_layer=1, d_model=64, n_head=2, seq_len=16)
        if quick
        else GPTConfig(n_layer=4, d_model=512, n_head=8, seq_len=16)
    )
    return GPTTraining(model=model, batch_size=2, warmup_steps=1).backend()


def torchtitan_backend(quick: bool, scratch: Path, asynchronous: bool) -> Any:
    """TorchTitan's llama3 debug model grown from 6 to 10 layers: ~115 MB with AdamW state.

    The debug model alone saves ~72 MB; four more copies of its block (dim 256) pass
    100 MB. DCP saves through TorchTitan's ``CheckpointManager``; an ``async_mode``
    makes the backend declare ``async_save`` (a synchronous save then waits).
    """
    import copy

    from baton.backends.torchtitan import TorchTitanBackend
    from baton.backends.torchtitan.configs import llama3_debug

    config = llama3_debug(
        steps=STEPS,
        seq_len=32,
        local_batch_size=2,
        dump_folder=str(scratch / "torchtitan"),
        log_freq=1000,
    )
    layers = config.model_spec.model.layers
    layers.extend(copy.deepcopy(layers[-1]) for _ in range(4))
    # async: staging on its own thread, overlapped with the next step's forward and
    # backward (pinned memory where an accelerator exists; the backend drops it on CPU);
    # sync: TorchTitan's synchronous DCP save, not an async one waited for
    config.checkpoint.async_mode = "async_with_pinned_mem" if asynchronous else "disabled"
    return TorchTitanBackend(config)


def megatron_backend(
    quick: bool, scratch: Path, asynchronous: bool, layers: int = 3, hidden: int = 512
) -> Any:
    """A Megatron-Core GPT, 3 layers of hidden 512: ~115 MB with Adam state.

    ``dist_checkpointing`` saves; asynchronous ones go through its ``AsyncCallsQueue``
    (a forked writer process), synchronous ones write in the loop.
    """
    from baton.backends.megatron import MegatronBackend, MegatronConfig
    from baton.backends.megatron.config import tiny_transformer_config

    config = MegatronConfig(
        model=tiny_transformer_config(
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=8,
            ffn_hidden_size=4 * hidden,
        ),
        seq_len=32,
        micro_batch_size=2,
        global_batch_size=2,
        warmup_steps=1,
        decay_steps=STEPS,
    )
    config.data.cache_dir = str(scratch / "megatron-data")
    return MegatronBackend(config)


def megatron_large_backend(quick: bool, scratch: Path, asynchronous: bool) -> Any:
    """The same GPT at 6 layers of hidden 1024: ~0.9 GB with Adam state. Megatron's
    async save has a per-save cost that does not grow with the state (the fork, the
    sharded state dict); this row shows the ratio at a larger state per rank."""
    return megatron_backend(quick, scratch, asynchronous, layers=6, hidden=1024)


def maxtext_backend(quick: bool, scratch: Path, asynchronous: bool) -> Any:
    """A MaxText decoder, 4 layers of width 512: ~120 MB with AdamW state (orbax saves).

    The JAX compilation cache is shared across the benchmark's runs (one compile).
    """
    from baton.backends.maxtext import TINY_CPU, MaxTextBackend, MaxTextConfig

    d_model, heads = 512, 8
    settings = TINY_CPU | {
        "run_name": "bench_checkpoint",
        "steps": STEPS,
        "per_device_batch_size": 2,
        "max_target_length": 32,
        "base_num_decoder_layers": 4,
        "base_emb_dim": d_model,
        "base_mlp_dim": 2 * d_model,
        "base_num_query_heads": heads,
        "base_num_kv_heads": heads,
        "head_dim": d_model // heads,
        "jax_cache_dir": str(scratch / "jax_cache"),
    }
    return MaxTextBackend(MaxTextConfig(overrides=settings))


@dataclass(frozen=True)
class Entry:
    """One backend: the module that must exist and a factory of a >= 100 MB state."""

    module: str
    #: (quick, scratch dir, asynchronous) -> a fresh backend
    make: Callable[[bool, Path, bool], Any]
    rounds: int = 3  # timed rounds of (sync, async), after one warm-up round
    warmup: int = 1
    #: run under ``--quick``? (a heavy backend's import and build take minutes)
    quick: bool = False


BACKENDS: dict[str, Entry] = {
    "fabric": Entry("baton.backends.fabric.backend", fabric_backend, quick=True),
    "torchtitan": Entry(
        "baton.backends.torchtitan.backend", torchtitan_backend, rounds=2, warmup=0
    ),
    "megatron": Entry("baton.backends.megatron.backend", megatron_backend, rounds=2, warmup=0),
    "megatron 0.9 GB": Entry(
        "baton.backends.megatron.backend", megatron_large_backend, rounds=2, warmup=0
    ),
    "maxtext": Entry("baton.backends.maxtext.backend", maxtext_backend, rounds=2, warmup=0),
}


def _synchronize_cuda() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class _SaveAndTime(Callback):
    """Requests the warm-up save and the timed one; records step boundaries and when
    the timed save completed."""

    def __init__(self) -> None:
        self.step_end: dict[int, float] = {}
        self.step_start: dict[int, float] = {}
        self.saved_at: float | None = None
        self.async_supported = False

    def on_step_start(self, driver: Any) -> None:
        if driver.step in WARMUP_SAVES:
            driver.wait_for_saves()  # a warm-up save is complete before timing goes on
        self.step_start[driver.step + 1] = time.perf_counter()

    def on_step_end(self, driver: Any, output: Any) -> None:
        # Wait for the step's device work: with asynchronous dispatch (JAX, CUDA) a save
        # would otherwise wait for the step in flight, and the gap would count compute
        # that an ordinary step overlaps with the next one.
        driver.backend.fetch(output.lazy_values())
        _synchronize_cuda()
        if driver.step in (*WARMUP_SAVES, SAVE_AT):
            driver.control.request_save("benchmark", all_ranks=True)
        self.step_end[driver.step] = time.perf_counter()

    def on_checkpoint_saved(self, driver: Any, path: Path) -> None:
        if path.name == ckpt.checkpoint_name(SAVE_AT):
            self.saved_at = time.perf_counter()
        # read on the set-up backend: support can depend on what setup built
        self.async_supported = "async_save" in driver.abilities

    def gap(self, step: int) -> float:
        """Time from the end of ``step`` to the start of the next one."""
        return self.step_start[step + 1] - self.step_end[step]

    def duration(self, step: int) -> float:
        return self.step_end[step] - self.step_start[step]


def save_once(make: Callable[[bool], Any], run_dir: Path, asynchronous: bool) -> dict[str, float]:
    """Train STEPS steps, saving at WARMUP_SAVES (untimed) and SAVE_AT; return the time the
    SAVE_AT save blocked the loop, when it completed, and the next step's extra time."""
    shutil.rmtree(run_dir, ignore_errors=True)
    timer = _SaveAndTime()
    driver = Driver(make(asynchronous), [timer], max_steps=STEPS, log_every=1000, run_dir=run_dir)
    driver.options = driver.options.replace(async_save=asynchronous)
    driver.fit()
    if timer.saved_at is None:
        raise RuntimeError("the checkpoint was never reported saved")
    saves = (*WARMUP_SAVES, SAVE_AT)
    ordinary = median([timer.gap(s) for s in range(1, STEPS) if s not in saves])
    # steps before the timed save, none right after a save, against the step after it
    after_saves = {s + 1 for s in WARMUP_SAVES}
    ordinary_step = median(
        [timer.duration(s) for s in range(2, SAVE_AT + 1) if s not in after_saves]
    )
    checkpoint = driver.saved[-1]
    size = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    return {
        "blocked": max(timer.gap(SAVE_AT) - ordinary, 1e-6),
        "total": timer.saved_at - timer.step_end[SAVE_AT],
        "next_step_extra": timer.duration(SAVE_AT + 1) - ordinary_step,
        "mb": size / 1e6,
        "async_supported": float(timer.async_supported),
    }


def measure(name: str, entry: Entry, quick: bool, scratch: Path) -> list[Row]:
    """Interleaved sync and async runs of one backend: its two rows."""

    def make(asynchronous: bool) -> Any:
        return entry.make(quick, scratch, asynchronous)

    probe = save_once(make, scratch / f"{name}-probe", asynchronous=True)
    supports_async = bool(probe["async_supported"])
    results: dict[str, list[dict[str, float]]] = {"sync": [], "async": []}

    def case(kind: str) -> Callable[[], float]:
        def run_case() -> float:
            result = save_once(make, scratch / f"{name}-{kind}", asynchronous=kind == "async")
            results[kind].append(result)
            return result["blocked"]

        return run_case

    cases = {"sync": case("sync")}
    if supports_async:
        cases["async"] = case("async")
    samples = interleave(
        cases, rounds=1 if quick else entry.rounds, warmup=0 if quick else entry.warmup
    )
    mb = results["sync"][-1]["mb"]
    small = f"; state below {MIN_STATE_MB} MB" if mb < MIN_STATE_MB and not quick else ""
    rows = [
        Row(
            NAME,
            f"{name}: synchronous save blocks",
            median(samples["sync"]),
            "s",
            note=f"state {mb:.0f} MB{small}",
        )
    ]
    if not supports_async:
        rows.append(skipped(NAME, f"{name}: async save blocks", f"{name} has no async save"))
        return rows
    ratio = paired_ratio(samples["async"], samples["sync"])
    total = median([r["total"] for r in results["async"]])
    extra = median([r["next_step_extra"] for r in results["async"]])
    rows.append(
        Row(
            NAME,
            f"{name}: async save blocks",
            median(samples["async"]),
            "s",
            ratio=ratio,
            baseline="sync",
            target=f"< {TARGET}",
            passed=at_most(ratio, TARGET),
            note=f"save completes {total:.2f} s after the step; next step {extra:+.3f} s",
        )
    )
    return rows


def run(quick: bool = False) -> list[Row]:
    scratch_root = os.environ.get("BATON_BENCH_SCRATCH")  # a disk, not tmpfs, for real writes
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="baton-bench-ckpt-", dir=scratch_root) as tmp:
        for name, entry in BACKENDS.items():
            case = f"{name}: synchronous save blocks"
            if importlib.util.find_spec(entry.module) is None:
                rows.append(skipped(NAME, case, f"{entry.module} is not installed/implemented"))
            elif quick and not entry.quick:
                rows.append(skipped(NAME, case, "not run with --quick (heavy backend)"))
            else:
                try:
                    rows += measure(name, entry, quick, Path(tmp))
                except Exception as error:  # one backend failing leaves the others' rows
                    traceback.print_exc()
                    note = f"error: {type(error).__name__}"
                    rows.append(Row(NAME, case, None, "", passed=False, note=note))
    return rows
