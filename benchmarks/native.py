"""Against each backend's own loop: the same backend and config, native loop vs baton.

One entry per backend, measured one of two ways; either way the row is the median of
paired ratios baton / native, each pair measured moments apart. Target: within 1.01.

* **Interleaved blocks** (Fabric, Megatron-Core: the native loop is the backend's step
  in a plain loop): one backend, one baton run (no user callbacks, log every 10
  steps). After every ``BLOCK`` baton steps, ``BLOCK`` native steps run on the same
  backend from ``on_step_end``, so the two sides alternate every fraction of a second
  and run the same model, data and caches; a block of either side holds one log step
  (one ``fetch``). A baton block is timed from the end of the native block before it
  to its last ``on_step_end`` (so the driver's work after a step counts). The first
  ``WARMUP_BLOCKS`` pairs (compilation, caches) are left out; ``rounds`` pairs count.
  One build per backend, and a neighbour's load burst spoils a pair or two, not a
  whole side.
* **Whole runs** (TorchTitan ``Trainer.train()``, MaxText ``train_loop``: loops that
  own their run): ``compare(steps) -> StepTimes`` trains ``steps`` steps with the
  backend's own loop and ``steps`` with baton's ``Driver``, each on a fresh backend,
  timed from the end of the first step to the end of the last; after a warm-up round,
  rounds alternate which side goes first (native, baton, baton, native, ...).

Entries import their backend lazily: while ``baton.backends.<name>.backend`` (or the
recipe an entry builds from) is missing, the row says so and nothing else runs.

Both sides run with baton's patches for the backend applied (the CPU fixes a backend
needs): the native loop runs inside a ``Driver`` that stops before its first step,
from ``on_train_start``, on the native objects the backend built. So the two sides
differ only in who drives the steps.

Native loops:

* ``fabric``: a bare Python loop over the backend's ``train_step`` (fetching every
  10 steps), i.e. the driver's cost over the thinnest possible loop;
* ``torchtitan``: TorchTitan's ``Trainer.train()`` on the Trainer the backend built;
* ``megatron``: a bare loop over the backend's step (Megatron-Core's
  forward-backward schedule and optimizer, no ``megatron.training``);
* ``maxtext``: MaxText's ``train_loop`` with the backend's MaxText config.

Run alone: ``uv run python benchmarks/run.py --only native``.
"""

from __future__ import annotations

import importlib.util
import inspect
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.core import Callback, Driver
from benchmarks.harness import Row, Skip, at_most, median, paired_ratio, skipped

NAME = "native"
LOG_EVERY = 10
TARGET = 1.01
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class StepTimes:
    """Seconds per step of one native run and one baton run of the same configuration."""

    native: float
    baton: float


#: backend, given the number of steps -> seconds per step of its native loop
NativeLoop = Callable[[Any, int], float]


@dataclass(frozen=True)
class Entry:
    """One backend: how to build it, what its native loop is, how many steps to time."""

    backend: str
    module: str  # must be importable, else the entry is skipped
    native_name: str
    make: Callable[[int], Any]  # steps -> a fresh, not yet set up, backend
    native: NativeLoop
    steps: int = 50
    rounds: int = 4
    #: steps under ``--quick``; ``None``: skipped there (a heavy backend's import and
    #: build take minutes; its own test suite covers it)
    quick_steps: int | None = None
    #: the native loop is ``bare_loop``: measured in interleaved blocks of ``BLOCK``
    #: steps (``steps`` is then unused; ``rounds`` counts timed pairs of blocks)
    blocks: bool = False

    def compare(self, steps: int, *, baton_first: bool = False) -> StepTimes:
        """A native run and a baton run, each on a freshly built backend."""
        sides: dict[str, Callable[[], float]] = {
            "native": lambda: native_seconds_per_step(self.make(steps), self.native, steps),
            "baton": lambda: baton_seconds_per_step(self.make(steps), steps),
        }
        order = ("baton", "native") if baton_first else ("native", "baton")
        times = {side: sides[side]() for side in order}
        return StepTimes(native=times["native"], baton=times["baton"])

    def interleaved(self, rounds: int) -> list[StepTimes]:
        """``WARMUP_BLOCKS + rounds`` pairs of blocks in one baton run: per pair, seconds
        per step of the baton block and of the native block right after it."""
        steps = BLOCK * (WARMUP_BLOCKS + rounds)
        backend = self.make(2 * steps)  # data for both sides' steps
        blocks = _NativeBlocks(BLOCK)
        with tempfile.TemporaryDirectory(prefix="baton-bench-native-") as tmp:
            Driver(backend, [blocks], max_steps=steps, log_every=LOG_EVERY, run_dir=Path(tmp)).fit()
        return blocks.pairs[WARMUP_BLOCKS:]


#: steps per block of the interleaved measure: one log step in each
BLOCK = LOG_EVERY
#: leading pairs of blocks left out (compilation, allocator and cache warm-up)
WARMUP_BLOCKS = 1


class _NativeBlocks(Callback):
    """Inside a baton run: after every ``block`` baton steps, ``block`` steps of the
    backend's step in a plain loop; records each pair's seconds per step."""

    priority = 10**9  # after every other callback's on_step_end

    def __init__(self, block: int) -> None:
        self.block = block
        self.pairs: list[StepTimes] = []
        self._mark = 0.0

    def on_train_start(self, driver: Any) -> None:
        self._mark = time.perf_counter()

    def on_step_end(self, driver: Any, output: Any) -> None:
        if driver.step % self.block:
            return
        baton = (time.perf_counter() - self._mark) / self.block
        native = bare_loop_block(driver.backend, driver.step, self.block)
        self.pairs.append(StepTimes(native=native, baton=baton))
        self._mark = time.perf_counter()


# -- the two sides ---------------------------------------------------------------------------
class _RunNative(Callback):
    """Runs the native loop from ``on_train_start`` (after every patch's setup hooks)."""

    priority = 10**9

    def __init__(self, loop: NativeLoop, steps: int) -> None:
        self.loop, self.steps = loop, steps
        self.seconds_per_step: float | None = None

    def on_train_start(self, driver: Any) -> None:
        self.seconds_per_step = self.loop(driver.backend, self.steps)


def native_seconds_per_step(backend: Any, loop: NativeLoop, steps: int) -> float:
    runner = _RunNative(loop, steps)
    with tempfile.TemporaryDirectory(prefix="baton-bench-native-") as tmp:
        # max_steps=0: the driver configures, sets up and patches, then runs no step itself
        Driver(backend, [runner], max_steps=0, run_dir=Path(tmp)).fit()
    assert runner.seconds_per_step is not None
    return runner.seconds_per_step


class _StepEnds(Callback):
    """Records when each step ends (one hook call per step: ~0.1 us against ms steps)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_step_end(self, driver: Any, output: Any) -> None:
        self.stamps.append(time.perf_counter())


def after_first(stamps: list[float]) -> float:
    """Seconds per step from the end of the first step to the last: setup, compilation
    and first-step warm-up are left out on both sides alike."""
    if len(stamps) < 2:
        raise ValueError(f"need >= 2 step timestamps, got {len(stamps)}")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def baton_seconds_per_step(backend: Any, steps: int) -> float:
    ends = _StepEnds()
    with tempfile.TemporaryDirectory(prefix="baton-bench-native-") as tmp:
        Driver(backend, [ends], max_steps=steps, log_every=LOG_EVERY, run_dir=Path(tmp)).fit()
    return after_first(ends.stamps)


# -- native loops ------------------------------------------------------------------------------
def bare_loop(backend: Any, steps: int) -> float:
    """The backend's step in a plain loop, fetching the metrics every LOG_EVERY steps."""
    stamps: list[float] = []
    for step in range(1, steps + 1):
        output = backend.train_step(step)
        if step % LOG_EVERY == 0 or step == steps:
            backend.fetch(output.lazy_values())
        stamps.append(time.perf_counter())
    return after_first(stamps)


def bare_loop_block(backend: Any, step: int, steps: int) -> float:
    """``steps`` of the backend's step in a plain loop, fetching the metrics of the
    last (one log step, as in baton's block); seconds per step."""
    started = time.perf_counter()
    for _ in range(steps - 1):
        backend.train_step(step)
    backend.fetch(backend.train_step(step).lazy_values())
    return (time.perf_counter() - started) / steps


def _native_object(backend: Any, cls: type, what: str) -> Any:
    """The object of type ``cls`` the backend holds (found by type, not by attribute name)."""
    for value in vars(backend).values():
        if isinstance(value, cls):
            return value
    raise Skip(f"the {backend.name} backend holds no {what} to run the native loop on")


def torchtitan_train(backend: Any, steps: int) -> float:
    """TorchTitan's own loop, ``Trainer.train()``, for ``steps`` more steps."""
    from torchtitan.trainer import Trainer

    trainer = _native_object(backend, Trainer, "torchtitan Trainer")
    trainer.config.training.steps = trainer.step + steps
    # baton's side runs without a Checkpoint callback: no saves on the native side either
    checkpointer = getattr(trainer, "checkpointer", None)
    if checkpointer is not None and hasattr(checkpointer, "enable"):
        checkpointer.enable = False
    stamps: list[float] = []
    step_fn = trainer.train_step

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        result = step_fn(*args, **kwargs)
        stamps.append(time.perf_counter())
        return result

    trainer.train_step = timed_step  # instance attribute: train() calls self.train_step
    try:
        trainer.train()
    finally:
        del trainer.train_step
    return after_first(stamps)


def maxtext_train_loop(backend: Any, steps: int) -> float:
    """MaxText's own loop, ``train_loop``, on the backend's resolved MaxText config.

    MaxText's loop builds its own state and data iterator; its data hook is pointed at
    the backend's text batches (the same stream baton's run reads), as the backend's
    parity test does.
    """
    from maxtext.configs.pyconfig import HyperParameters
    from maxtext.input_pipeline import input_pipeline_interface
    from maxtext.trainers.pre_train import train

    config = _native_object(backend, HyperParameters, "MaxText config")
    batches = getattr(backend, "batches", None)
    if batches is None:
        raise Skip("the maxtext backend holds no text batches to feed MaxText's train_loop")
    if int(config.steps) != steps:
        raise Skip(f"MaxText config has steps={config.steps}, the benchmark asked for {steps}")
    timed = _TimedBatches(batches)
    real_factory = input_pipeline_interface.create_data_iterator
    input_pipeline_interface.create_data_iterator = lambda cfg, mesh: (timed, None)
    try:
        train.train_loop(config, None)
    finally:
        input_pipeline_interface.create_data_iterator = real_factory
    # a batch is drawn at the start of each step: batch k+1 is drawn when step k is done
    return after_first(timed.stamps[1:])


class _TimedBatches:
    """An iterator over ``inner`` that records when each batch is drawn."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.stamps: list[float] = []

    def __iter__(self) -> _TimedBatches:
        return self

    def __next__(self) -> Any:
        self.stamps.append(time.perf_counter())
        return next(self.inner)

    def __getattr__(self, name: str) -> Any:  # state_dict etc. of the real stream
        return getattr(self.inner, name)


# -- building backends -----------------------------------------------------------------------
def fabric_tiny(steps: int) -> Any:
    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining

    model = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32)
    return GPTTraining(model=model, batch_size=8, accelerator="auto").backend()


def from_recipe(path: str) -> Callable[[int], Any]:
    """A factory calling ``recipe(max_steps=steps)`` in ``recipes/<path>`` for its backend."""

    def make(steps: int) -> Any:
        file = ROOT / "recipes" / path
        if not file.exists():
            raise Skip(f"recipes/{path} does not exist yet")
        spec = importlib.util.spec_from_file_location(f"_bench_recipe_{file.stem}", file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        params = inspect.signature(module.recipe).parameters
        extra: dict[str, Any] = {}
        if "run_dir" in params:  # native dump folders go to a scratch dir, not runs/
            extra["run_dir"] = tempfile.mkdtemp(prefix=f"baton-bench-{file.stem}-")
        if "progress" in params:
            extra["progress"] = False
        return module.recipe(max_steps=steps, **extra).backend

    return make


ENTRIES: tuple[Entry, ...] = (
    Entry("fabric", "baton.backends.fabric.backend", "bare loop over train_step", fabric_tiny,
          bare_loop, rounds=30, quick_steps=BLOCK, blocks=True),
    Entry("torchtitan", "baton.backends.torchtitan.backend", "TorchTitan Trainer.train()",
          from_recipe("torchtitan_llama3_debug.py"), torchtitan_train, steps=12, rounds=2),
    Entry("megatron", "baton.backends.megatron.backend", "plain Megatron-Core loop",
          from_recipe("megatron_gpt_tiny.py"), bare_loop, rounds=20, blocks=True),
    Entry("maxtext", "baton.backends.maxtext.backend", "MaxText train_loop",
          from_recipe("maxtext_tiny.py"), maxtext_train_loop, steps=30, rounds=2),
)  # fmt: skip


def run_entry(entry: Entry, quick: bool) -> Row:
    case = f"{entry.backend}: {entry.native_name} vs baton"
    if importlib.util.find_spec(entry.module) is None:
        return skipped(NAME, case, f"{entry.module} is not installed/implemented")
    if quick and entry.quick_steps is None:
        return skipped(NAME, case, "not run with --quick (heavy backend)")
    quick_rounds = 2 if entry.blocks else 1
    steps, rounds = (entry.quick_steps or 0, quick_rounds) if quick else (entry.steps, entry.rounds)
    try:
        if entry.blocks:
            pairs = entry.interleaved(rounds)
            how = f"{rounds} interleaved pairs of {BLOCK}-step blocks in one run"
        else:
            entry.compare(steps)  # warm-up: imports, compilation, caches
            pairs = [entry.compare(steps, baton_first=i % 2 == 1) for i in range(rounds)]
            how = f"{steps} steps x {rounds} rounds"
    except Skip as reason:
        return skipped(NAME, case, str(reason))
    except Exception as error:  # one backend failing leaves the others' rows
        traceback.print_exc()
        return Row(NAME, case, None, "", passed=False, note=f"error: {type(error).__name__}")
    native = [p.native for p in pairs]
    baton = [p.baton for p in pairs]
    ratio = paired_ratio(baton, native)
    return Row(
        NAME,
        case,
        median(baton) * 1e3,
        "ms/step",
        ratio=ratio,
        baseline="native",
        target=f"<= {TARGET}",
        passed=at_most(ratio, TARGET),
        note=f"native {median(native) * 1e3:.3g} ms/step, {how}",
    )


def run(quick: bool = False) -> list[Row]:
    return [run_entry(entry, quick) for entry in ENTRIES]
