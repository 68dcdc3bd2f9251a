"""Speed at real size on one GPU: baton's Fabric SFT and DPO against TRL and a hand loop,
Megatron-Core against its bare loop; seconds per step, MFU and peak memory, one line a row.

Run from the repository root on a CUDA machine (``benchmarks/README.md``, "GPU speed",
says how on a machine's stock image with baton's packages as wheels)::

    python benchmarks/gpu_speed.py --out $OUT               # every row (minutes on one GPU)
    python benchmarks/gpu_speed.py --only fabric-sft-1x4 --only trl-sft-matched
    python benchmarks/gpu_speed.py --tiny                   # tiny model, CPU, a minute or two

Every row trains the same inputs (``gpu_speed_inputs.py``): a random-weight Qwen3 in
Qwen3-0.6B's shape, packed rows of ``--seq-len`` (4,096) tokens, 4 rows a step, bf16-mixed,
one process; ``--steps`` (15) steps, of which steps 4-15 are timed with one
``torch.cuda.synchronize()`` at each edge of the window (never one per step).

Rows (``--only NAME``, repeatable; default all, in this order):

* ``hand-loop``: plain PyTorch and ``transformers`` over baton's packed rows, 1 row per
  micro-batch and 4 accumulated, the model's own loss (``labels``, ``position_ids``
  restarting per document), AdamW, gradient clipping at 1.0;
* ``trl-sft-defaults`` / ``trl-sft-matched``: TRL's ``SFTTrainer`` on the same documents
  (bfd packing to ``--seq-len``, 4 rows a step, completion-only loss) with its defaults
  (gradient checkpointing on) and matched (``gradient_checkpointing=False``,
  ``pad_to_multiple_of=64``);
* ``fabric-sft-1x4`` / ``fabric-sft-4x1``: ``recipes/hf_finetune.py --objective sft``, one
  row per micro-batch and 4 accumulated, and 4 rows in one micro-batch;
* ``trl-dpo-defaults`` / ``trl-dpo-matched``: TRL's ``DPOTrainer``, 8 pairs a step, its
  reference live with gradient checkpointing (defaults) and precomputed without
  (``precompute_ref_log_probs=True``, ``gradient_checkpointing=False``);
* ``fabric-dpo``: ``hf_finetune.py --objective dpo``, 8 pairs a step (two to a row), the
  reference's log-probabilities precomputed before the first step;
* ``fabric-sft-parity`` / ``fabric-dpo-parity``: not a speed: the first step's loss and
  gradient norm with the levers as ``auto`` picks them and with each lever off
  (``PLAIN_PATH``: ``--attention sdpa --cross-entropy full --compile-layers off
  --fused-optimizer off``, the ones the recipe has; skipped where it has none), 4 rows
  in one micro-batch, the same rows, weights and seed; within ``PARITY_TOLERANCE``
  (bf16) relative;
* ``megatron-bare`` / ``megatron``: ``recipes/megatron_llama3_8b.py`` with a 0.55 B Llama
  ``--model-config`` (``--tp 1``, 1 x 4 micro-batches of ``--seq-len``): Megatron-Core's
  step in a bare loop (``native.py``'s) and driven by baton.

MFU = tokens a step x (6 x parameters + 6 x layers x seq_len x attention width, causal
attention) / seconds a step / the device's datasheet dense bf16 peak (``PEAK_TFLOPS``;
``--peak-tflops`` for another device; on a CPU MFU is ``n/a``). Peak memory is
``torch.cuda.max_memory_allocated()``, reset before each row. ``paths`` are what the row
ran: for baton's rows the paths its run recorded in its settings (attention, cross
entropy, compile, fused optimizer), ``n/a`` where none is recorded.

A row that fails prints its error on its line (the traceback on stderr) and the others
run. Then one line per target, and ``gpu_speed.json`` and ``gpu_speed.md`` under ``--out``.

Example::

    python benchmarks/gpu_speed.py --tiny --only hand-loop --only fabric-sft-1x4 --out /tmp/g
    # hand-loop          0.0213 s/step  MFU n/a  peak n/a  paths attention=sdpa ...
    # fabric-sft-1x4     0.0231 s/step  1.08x hand-loop  MFU n/a  ...
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(HERE)]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_speed_inputs import REAL, TINY, Decoder, Inputs, Shape  # noqa: E402
from benchmarks.harness import Skip  # noqa: E402

FINETUNE = ROOT / "recipes" / "hf_finetune.py"
MEGATRON = ROOT / "recipes" / "megatron_llama3_8b.py"
LR = 1e-5
#: datasheet dense bf16 peaks, TFLOP/s, by a part of the device's name (first match)
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
)
#: the settings a run records for the paths it took (``fast_paths`` a dict of them)
PATH_SETTINGS = ("attention", "cross_entropy", "compile_layers", "fused_optimizer")
#: each lever's setting for the plain path (a parity row compares the levers with it)
PLAIN_PATH = {
    "attention": "sdpa",
    "cross_entropy": "full",
    "compile_layers": "off",
    "fused_optimizer": "off",
}
#: relative differences in bf16 the parity rows accept, levers against the plain path
PARITY_TOLERANCE = {"loss": 1e-2, "grad_norm": 5e-2}


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
    from baton.core import Callback

    class Timed(Callback):
        priority = 10**9  # after every other callback's work of the step

        def on_step_start(self, driver: Any) -> None:
            window.begin(driver.step)

        def on_step_end(self, driver: Any, output: Any) -> None:
            window.end(driver.step)

    return Timed()


def trl_timer(window: Window) -> Any:
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


def peak_tflops(device_name: str, override: float | None) -> float | None:
    if override is not None:
        return override
    for part, peak in PEAK_TFLOPS:
        if part in device_name:
            return peak
    return None


def recorded_paths(*settings: dict[str, Any]) -> str:
    """The paths a baton run recorded (``fast_paths``, else each of ``PATH_SETTINGS``),
    ``key=value`` joined; ``n/a`` where none is recorded."""
    found: dict[str, Any] = {}
    for recorded in settings:
        nested = recorded.get("fast_paths")
        if isinstance(nested, dict):
            found.update(nested)
        found.update({k: recorded[k] for k in PATH_SETTINGS if k in recorded})
    return " ".join(f"{k}={v}" for k, v in found.items()) or "n/a"


def hf_paths(model: Any, **more: Any) -> str:
    attention = getattr(model.config, "_attn_implementation", None) or "n/a"
    return " ".join(f"{k}={v}" for k, v in {"attention": attention, **more}.items())


# -- the rows -------------------------------------------------------------------------------
class Bench:
    """The run's settings and inputs; each row is a method returning ``Measured``."""

    def __init__(self, inputs: Inputs, precision: str) -> None:
        import torch

        self.inputs, self.shape, self.precision = inputs, inputs.shape, precision
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.scratch = inputs.root / "runs"

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16-mixed"

    def window(self) -> Window:
        return Window(self.shape.timed_from, self.shape.steps)

    def run_dir(self, name: str) -> Path:
        self.scratch.mkdir(exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.scratch))

    def qwen3_flops(self) -> float:
        count = parameter_count(self.inputs.qwen3())
        return training_flops_per_token(self.shape.qwen3, count, self.shape.seq_len)

    def row_tokens(self) -> int:
        return self.shape.rows * self.shape.seq_len

    # -- baton's Fabric rows
    def fabric(self, objective: str, data: Path, batch_size: int, grad_accum: int) -> Measured:
        from baton.core.cli.recipe import build_driver

        window, run_dir = self.window(), self.run_dir(f"fabric-{objective}")
        driver = build_driver(FINETUNE, [
            "--objective", objective, "--init-from", str(self.inputs.qwen3()),
            "--tokenizer", str(self.inputs.tokenizer), "--data-path", str(data),
            "--accelerator", "cuda" if self.cuda else "cpu", "--precision", self.precision,
            "--batch-size", str(batch_size), "--grad-accum", str(grad_accum), "--lr", str(LR),
            "--max-steps", str(self.shape.steps), "--log-every", str(self.shape.steps),
            "--eval-every", "0", "--save-every", "0", "--no-progress", "--run-dir", str(run_dir),
        ])  # fmt: skip
        assert driver is not None
        driver.callbacks = [c for c in driver.callbacks if type(c).__name__ != "Checkpoint"]
        driver.callbacks.append(baton_timer(window))
        driver.fit()
        record = run_dir / "run.json"
        recorded = json.loads(record.read_text()) if record.exists() else {}
        paths = recorded_paths(
            recorded.get("settings", {}), recorded.get("backend", {}), driver.options.settings
        )
        return Measured(window.per_step(), self.row_tokens(), self.qwen3_flops(), paths)

    def fabric_sft_1x4(self) -> Measured:
        return self.fabric("sft", self.inputs.sft()[0], 1, self.shape.rows)

    def fabric_sft_4x1(self) -> Measured:
        return self.fabric("sft", self.inputs.sft()[0], self.shape.rows, 1)

    def fabric_dpo(self) -> Measured:
        measured = self.fabric("dpo", self.inputs.pairs()[0], self.shape.rows, 1)
        measured.note = f"{self.shape.pairs} pairs a step, reference precomputed"
        return measured

    # -- the levers against the plain path, first step
    def plain_path_flags(self) -> list[str]:
        """``hf_finetune.py``'s flags that turn each of its levers off (those it has)."""
        import importlib.util
        import inspect

        spec = importlib.util.spec_from_file_location("_gpu_speed_finetune", FINETUNE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        params = inspect.signature(module.recipe).parameters
        flags: list[str] = []
        for name, plain in PLAIN_PATH.items():
            if name in params:
                flags += [f"--{name.replace('_', '-')}", plain]
        return flags

    def first_step(self, objective: str, data: Path, flags: list[str]) -> dict[str, float]:
        from baton.core import Callback
        from baton.core.cli.recipe import build_driver

        logged: dict[int, dict[str, float]] = {}

        class Logged(Callback):
            def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
                logged[driver.step] = dict(metrics)

        driver = build_driver(FINETUNE, [
            "--objective", objective, "--init-from", str(self.inputs.qwen3()),
            "--tokenizer", str(self.inputs.tokenizer), "--data-path", str(data),
            "--accelerator", "cuda" if self.cuda else "cpu", "--precision", self.precision,
            "--batch-size", str(self.shape.rows), "--lr", str(LR), "--max-steps", "1",
            "--log-every", "1", "--eval-every", "0", "--save-every", "0", "--no-progress",
            "--run-dir", str(self.run_dir(f"parity-{objective}")), *flags,
        ])  # fmt: skip
        assert driver is not None
        driver.callbacks = [c for c in driver.callbacks if type(c).__name__ != "Checkpoint"]
        driver.callbacks.append(Logged())
        driver.fit()
        return logged[1]

    def parity(self, objective: str, data: Path) -> Measured:
        """The first step's loss and gradient norm with the levers as a run picks them
        (``auto``) and with every lever off: the same rows, weights and seed."""
        plain_flags = self.plain_path_flags()
        if not plain_flags:
            names = ", ".join(f"--{n.replace('_', '-')}" for n in PLAIN_PATH)
            raise Skip(f"hf_finetune.py has none of the lever settings ({names})")
        fast = self.first_step(objective, data, [])
        plain = self.first_step(objective, data, plain_flags)
        figures = {k: (float(fast[k]), float(plain[k])) for k in ("loss", "grad_norm")}
        return Measured(None, paths=" ".join(plain_flags), parity=figures)

    def fabric_sft_parity(self) -> Measured:
        return self.parity("sft", self.inputs.sft()[0])

    def fabric_dpo_parity(self) -> Measured:
        return self.parity("dpo", self.inputs.pairs()[0])

    # -- a hand-written loop
    def hand_loop(self) -> Measured:
        import torch

        from baton.data.packed import PackedDataset

        shape, window = self.shape, self.window()
        model: Any = self.load_qwen3().to(self.device)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        data = PackedDataset(self.inputs.sft()[0])
        pad = int(self.inputs.hf_tokenizer.pad_token_id)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)
        for step in range(1, shape.steps + 1):
            window.begin(step - 1)
            rows = [((step - 1) * shape.rows + i) % data.num_rows for i in range(shape.rows)]
            batch = data.batch(rows, pad_id=pad)
            inputs = torch.from_numpy(batch.inputs).to(self.device, non_blocking=True)
            positions = torch.from_numpy(batch.positions).long().to(self.device)
            targets = torch.from_numpy(batch.targets)
            labels = targets.masked_fill(~torch.from_numpy(batch.loss_mask), -100)
            labels = labels.to(self.device)
            supervised = batch.supervised_tokens
            for i in range(shape.rows):  # 1 row per micro-batch, all accumulated
                with autocast:
                    loss = model(
                        input_ids=inputs[i : i + 1], position_ids=positions[i : i + 1],
                        labels=labels[i : i + 1], shift_labels=labels[i : i + 1],
                        num_items_in_batch=supervised,
                    ).loss  # fmt: skip
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            window.end(step)
        paths = hf_paths(model, cross_entropy="transformers", optimizer="AdamW")
        return Measured(window.per_step(), self.row_tokens(), self.qwen3_flops(), paths)

    # -- TRL
    def trl_args(self, config_type: Any, name: str, batch: int, **extra: Any) -> Any:
        return config_type(
            output_dir=str(self.run_dir(name)), max_steps=self.shape.steps,
            per_device_train_batch_size=batch, learning_rate=LR, lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, report_to="none",
            use_cpu=not self.cuda, logging_steps=self.shape.steps, save_strategy="no",
            dataloader_num_workers=0, seed=0, bf16=self.bf16, **extra,
        )  # fmt: skip

    def load_qwen3(self) -> Any:
        import torch
        import transformers

        return transformers.AutoModelForCausalLM.from_pretrained(
            self.inputs.qwen3(), dtype=torch.float32
        )

    def trl_sft(self, matched: bool) -> Measured:
        import datasets
        from trl.trainer.sft_config import SFTConfig
        from trl.trainer.sft_trainer import SFTTrainer

        window, docs = self.window(), self.inputs.sft()[1]
        levers = {"gradient_checkpointing": False, "pad_to_multiple_of": 64} if matched else {}
        args = self.trl_args(
            SFTConfig, "trl-sft", self.shape.rows, packing=True, packing_strategy="bfd",
            max_length=self.shape.seq_len, completion_only_loss=True, **levers,
        )  # fmt: skip
        trainer = SFTTrainer(
            model=self.load_qwen3(),
            args=args,
            train_dataset=datasets.Dataset.from_dict(
                {"input_ids": [t for t, _ in docs], "completion_mask": [m for _, m in docs]}
            ),
            processing_class=self.inputs.hf_tokenizer,
            callbacks=[trl_timer(window)],
        )
        trainer.train()
        paths = hf_paths(trainer.model, gradient_checkpointing=args.gradient_checkpointing)
        return Measured(window.per_step(), self.row_tokens(), self.qwen3_flops(), paths)

    def trl_sft_defaults(self) -> Measured:
        return self.trl_sft(matched=False)

    def trl_sft_matched(self) -> Measured:
        return self.trl_sft(matched=True)

    def trl_dpo(self, matched: bool) -> Measured:
        import datasets
        from trl.trainer.dpo_config import DPOConfig
        from trl.trainer.dpo_trainer import DPOTrainer

        window, pairs = self.window(), self.inputs.pairs()[1]
        levers = {"precompute_ref_log_probs": True, "gradient_checkpointing": False}
        args = self.trl_args(
            DPOConfig, "trl-dpo", self.shape.pairs, max_length=None,
            **(levers if matched else {}),
        )  # fmt: skip
        trainer = DPOTrainer(
            model=self.load_qwen3(),
            ref_model=self.load_qwen3(),
            args=args,
            train_dataset=datasets.Dataset.from_list(pairs),
            processing_class=self.inputs.hf_tokenizer,
            callbacks=[trl_timer(window)],
        )
        trainer.train()
        paths = hf_paths(
            trainer.model,
            gradient_checkpointing=args.gradient_checkpointing,
            reference="precomputed" if args.precompute_ref_log_probs else "live",
        )
        note = f"{self.shape.pairs} pairs a step, padded per batch (no MFU: not packed)"
        return Measured(window.per_step(), paths=paths, note=note)

    def trl_dpo_defaults(self) -> Measured:
        return self.trl_dpo(matched=False)

    def trl_dpo_matched(self) -> Measured:
        return self.trl_dpo(matched=True)

    # -- Megatron-Core
    def megatron_driver(self) -> Any:
        from baton.core.cli.recipe import build_driver

        shape = self.shape
        driver = build_driver(MEGATRON, [
            "--model-config", str(self.inputs.llama()), "--tp", "1",
            "--seq-len", str(shape.seq_len), "--batch-size", "1",
            "--global-batch-size", str(shape.rows), "--max-steps", str(shape.steps),
            "--lr", str(LR), "--data-path", str(self.inputs.pretraining()),
            "--tokenizer", str(self.inputs.tokenizer), "--save-every", "0",
            "--set", "data.split=100,0,0",  # all of it trains: nothing is evaluated
            "--run-dir", str(self.run_dir("megatron")),
        ])  # fmt: skip
        assert driver is not None
        driver.callbacks = [c for c in driver.callbacks if type(c).__name__ != "Checkpoint"]
        driver.options = driver.options.replace(log_every=shape.steps, eval_every=0)
        return driver

    def megatron_measured(self, seconds: float, backend: Any) -> Measured:
        from baton.backends.megatron.build import layer_choice

        count = parameter_count(self.inputs.llama())
        flops = training_flops_per_token(self.shape.llama, count, self.shape.seq_len)
        layers = layer_choice(backend.config)
        return Measured(seconds, self.row_tokens(), flops, f"layers={layers}")

    def megatron(self) -> Measured:
        window, driver = self.window(), self.megatron_driver()
        driver.callbacks.append(baton_timer(window))
        driver.fit()
        return self.megatron_measured(window.per_step(), driver.backend)

    def megatron_bare(self) -> Measured:
        from benchmarks.native import native_seconds_per_step

        window, backend = self.window(), self.megatron_driver().backend

        def bare(backend: Any, steps: int) -> float:
            for step in range(1, steps + 1):
                window.begin(step - 1)
                output = backend.train_step(step)
                if step == steps:  # the one log step, as baton's run has
                    backend.fetch(output.lazy_values())
                window.end(step)
            return window.per_step()

        seconds = native_seconds_per_step(backend, bare, self.shape.steps)
        return self.megatron_measured(seconds, backend)


@dataclass(frozen=True)
class RowSpec:
    name: str
    title: str
    method: str
    #: rows this one's time is compared with (``Nx name`` on its line)
    against: tuple[str, ...] = ()


ROWS: tuple[RowSpec, ...] = (
    RowSpec("hand-loop", "a hand-written loop, same rows and layout (1 x 4)", "hand_loop"),
    RowSpec("trl-sft-defaults", "TRL SFTTrainer, its defaults (gradient checkpointing on)",
            "trl_sft_defaults"),
    RowSpec("trl-sft-matched", "TRL SFTTrainer, bfd, pad to 64, no checkpointing",
            "trl_sft_matched"),
    RowSpec("fabric-sft-1x4", "baton Fabric SFT, 1 row per micro-batch, 4 accumulated",
            "fabric_sft_1x4", ("hand-loop", "trl-sft-matched", "trl-sft-defaults")),
    RowSpec("fabric-sft-4x1", "baton Fabric SFT, 4 rows in one micro-batch", "fabric_sft_4x1",
            ("fabric-sft-1x4", "trl-sft-matched", "trl-sft-defaults")),
    RowSpec("trl-dpo-defaults", "TRL DPOTrainer, its defaults (live reference)",
            "trl_dpo_defaults"),
    RowSpec("trl-dpo-matched", "TRL DPOTrainer, reference precomputed, no checkpointing",
            "trl_dpo_matched"),
    RowSpec("fabric-dpo", "baton Fabric DPO, reference precomputed", "fabric_dpo",
            ("trl-dpo-matched", "trl-dpo-defaults")),
    RowSpec("fabric-sft-parity", "baton Fabric SFT, first step: levers vs plain path",
            "fabric_sft_parity"),
    RowSpec("fabric-dpo-parity", "baton Fabric DPO, first step: levers vs plain path",
            "fabric_dpo_parity"),
    RowSpec("megatron-bare", "Megatron-Core, a bare loop over the same step", "megatron_bare"),
    RowSpec("megatron", "baton Megatron-Core (megatron_llama3_8b.py)", "megatron",
            ("megatron-bare",)),
)  # fmt: skip
BY_NAME = {row.name: row for row in ROWS}


@dataclass(frozen=True)
class Target:
    """A target of the run: ``check(results)`` gives (the figures, passed) or None where
    its rows did not run (or MFU is unknown)."""

    text: str
    check: Callable[[dict[str, Result]], tuple[str, bool] | None]


def _mfu_at_least(floor: float) -> Callable[[dict[str, Result]], tuple[str, bool] | None]:
    def check(results: dict[str, Result]) -> tuple[str, bool] | None:
        got = {n: results[n].mfu for n in ("fabric-sft-1x4", "fabric-sft-4x1") if n in results}
        known = {n: m for n, m in got.items() if m is not None}
        if not known:
            return None
        text = ", ".join(f"{n} {m:.1%}" for n, m in known.items())
        return text, all(m >= floor for m in known.values())

    return check


def _ratio_at_most(
    rows: tuple[str, ...], baseline: str, ceiling: float
) -> Callable[[dict[str, Result]], tuple[str, bool] | None]:
    def check(results: dict[str, Result]) -> tuple[str, bool] | None:
        known = {n: results[n].ratios[baseline] for n in rows
                 if n in results and baseline in results[n].ratios}  # fmt: skip
        if not known:
            return None
        text = ", ".join(f"{n} {r:.3f}x" for n, r in known.items())
        return text, all(r <= ceiling for r in known.values())

    return check


def _same_mfu(results: dict[str, Result]) -> tuple[str, bool] | None:
    one, four = results.get("fabric-sft-1x4"), results.get("fabric-sft-4x1")
    if one is None or four is None or one.mfu is None or four.mfu is None:
        return None
    gap = abs(one.mfu - four.mfu) / max(one.mfu, four.mfu)
    return f"1x4 {one.mfu:.1%}, 4x1 {four.mfu:.1%}: {gap:.1%} apart", gap <= 0.05


def _parity(results: dict[str, Result]) -> tuple[str, bool] | None:
    known = {n: r.parity for n, r in results.items() if r.parity is not None}
    if not known:
        return None
    text = "; ".join(
        f"{n} " + ", ".join(f"{k} {v:.1e}" for k, v in parity.items())
        for n, parity in known.items()
    )
    met = all(v <= PARITY_TOLERANCE[k] for p in known.values() for k, v in p.items())
    return text, met


SFT = ("fabric-sft-1x4", "fabric-sft-4x1")
TARGETS: tuple[Target, ...] = (
    Target("Fabric SFT >= 35% MFU", _mfu_at_least(0.35)),
    Target("Fabric SFT <= 0.5x TRL SFTTrainer defaults", _ratio_at_most(SFT, "trl-sft-defaults", 0.5)),
    Target("Fabric SFT <= 0.8x TRL SFTTrainer matched", _ratio_at_most(SFT, "trl-sft-matched", 0.8)),
    Target("Fabric DPO <= 0.5x TRL DPOTrainer defaults",
           _ratio_at_most(("fabric-dpo",), "trl-dpo-defaults", 0.5)),
    Target("SFT MFU within 5% between 1x4 and 4x1", _same_mfu),
    Target("levers give the plain path's first loss (1e-2) and gradient norm (5e-2) in bf16",
           _parity),
)  # fmt: skip


# -- running and reporting ------------------------------------------------------------------
def run_row(bench: Bench, spec: RowSpec, peak: float | None, done: dict[str, Result]) -> Result:
    """One row, isolated: its error becomes its result; the device is cleaned after it."""
    import torch

    result = Result(spec.name, spec.title)
    if bench.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        measured: Measured = getattr(bench, spec.method)()
    except Skip as reason:
        result.skipped = str(reason)
    except Exception as error:  # one row failing leaves the others
        traceback.print_exc()
        first = (str(error).strip().splitlines() or [""])[0][:300]
        result.error = f"{type(error).__name__}: {first}"
    else:
        seconds = result.seconds_per_step = measured.seconds_per_step
        result.paths, result.note = measured.paths, measured.note
        if seconds and peak is not None and measured.tokens and measured.flops_per_token:
            result.mfu = measured.tokens * measured.flops_per_token / seconds / (peak * 1e12)
        for other in spec.against:
            base = done.get(other)
            if seconds and base is not None and base.seconds_per_step:
                result.ratios[other] = seconds / base.seconds_per_step
        if measured.parity is not None:
            result.note = ", ".join(
                f"{k} {fast:.6g} vs plain {plain:.6g}"
                for k, (fast, plain) in measured.parity.items()
            )
            result.parity = {
                k: abs(fast - plain) / max(abs(plain), 1e-12)
                for k, (fast, plain) in measured.parity.items()
            }
    if bench.cuda:
        result.peak_memory_gib = torch.cuda.max_memory_allocated() / 2**30
    gc.collect()
    if bench.cuda:
        torch.cuda.empty_cache()
    return result


def line(result: Result) -> str:
    """The row's one printed line."""
    if result.error is not None:
        return f"{result.name:<17} error: {result.error}"
    if result.skipped is not None:
        return f"{result.name:<17} skipped: {result.skipped}"
    if result.parity is not None:
        differences = ", ".join(f"{k} rel {v:.2e}" for k, v in result.parity.items())
        return f"{result.name:<17} {differences} ({result.note})  plain path: {result.paths}"
    parts = [f"{result.name:<17} {result.seconds_per_step:.4g} s/step"]
    parts += [f"{ratio:.3f}x {name}" for name, ratio in result.ratios.items()]
    parts.append("MFU n/a" if result.mfu is None else f"MFU {result.mfu:.1%}")
    memory = result.peak_memory_gib
    parts.append("peak n/a" if memory is None else f"peak {memory:.1f} GiB")
    parts.append(f"paths {result.paths}")
    return "  ".join(parts)


VERDICT = {True: "yes", False: "NO", None: "n/a"}


def target_lines(results: dict[str, Result]) -> list[tuple[str, str, bool | None]]:
    out = []
    for target in TARGETS:
        checked = target.check(results)
        if checked is None:
            out.append((target.text, "n/a (rows not run, or MFU unknown)", None))
        else:
            out.append((target.text, *checked))
    return out


def environment(bench: Bench, peak: float | None) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    versions = {}
    for name in ("torch", "transformers", "trl", "lightning", "megatron-core", "accelerate",
                 "transformer-engine", "liger-kernel", "baton-backends"):  # fmt: skip
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    device = torch.cuda.get_device_name(0) if bench.cuda else platform.processor() or "cpu"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "device": device,
        "peak_tflops": peak,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
        "shape": asdict(bench.shape),
        "precision": bench.precision,
    }


def markdown(results: list[Result], targets: list[tuple[str, str, bool | None]],
             env: dict[str, Any]) -> str:  # fmt: skip
    lines = [
        f"GPU speed, {env['date']} on {env['device']} (peak {env['peak_tflops'] or 'n/a'} TFLOP/s), "
        f"{env['precision']}; versions: "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        "",
        "| row | s/step | ratio | MFU | peak memory | paths |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.error is not None or r.skipped is not None:
            why = f"error: {r.error}" if r.error is not None else f"skipped: {r.skipped}"
            lines.append(f"| {r.title} | {why} | | | | |")
            continue
        if r.parity is not None:
            lines.append(f"| {r.title} | {r.note} | | | | {r.paths} |")
            continue
        ratio = ", ".join(f"{v:.3f}x {k}" for k, v in r.ratios.items())
        mfu = "n/a" if r.mfu is None else f"{r.mfu:.1%}"
        memory = "n/a" if r.peak_memory_gib is None else f"{r.peak_memory_gib:.1f} GiB"
        lines.append(
            f"| {r.title} | {r.seconds_per_step:.3f} | {ratio} | {mfu} | {memory} | {r.paths} |"
        )
    lines += ["", "| target | figures | met |", "|---|---|---|"]
    for text, figures, passed in targets:
        lines.append(f"| {text} | {figures} | {VERDICT[passed]} |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--only",
        "--rows",
        action="append",
        default=None,
        help="rows to run, comma-separated or repeated (default all): " + ", ".join(BY_NAME),
    )
    parser.add_argument("--steps", type=int, default=None, help="steps a row trains (15)")
    parser.add_argument(
        "--timed-from",
        type=int,
        default=None,
        help="the first timed step (4); the window ends at --steps",
    )
    parser.add_argument("--seq-len", type=int, default=None, help="tokens a row (4096)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny models, short rows, few steps (CPU, a minute or two)",
    )
    parser.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the device's dense bf16 peak (default: by device name)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "results" / "gpu_speed",
        help="where gpu_speed.json and gpu_speed.md go",
    )
    args = parser.parse_args(argv)
    if args.only is not None:
        args.only = [name for given in args.only for name in given.split(",") if name]
        unknown = [name for name in args.only if name not in BY_NAME]
        if unknown:
            parser.error(f"no row {unknown[0]!r}; the rows: {', '.join(BY_NAME)}")
    for name in ("steps", "timed_from", "seq_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    return args  # fmt: skip


def shape_of(args: argparse.Namespace) -> Shape:
    import dataclasses

    shape = TINY if args.tiny else REAL
    changes = {k: v for k, v in (("steps", args.steps), ("timed_from", args.timed_from),
                                 ("seq_len", args.seq_len)) if v is not None}  # fmt: skip
    shape = dataclasses.replace(shape, **changes)
    if shape.timed_from > shape.steps:
        raise SystemExit(f"--timed-from {shape.timed_from} is past --steps {shape.steps}")
    return shape


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from baton.core.logs import setup_logging

    setup_logging()  # baton's one-off lines (the paths a run takes, Megatron's layers)
    import transformers

    transformers.logging.set_verbosity_error()
    shape = shape_of(args)
    names = args.only or [row.name for row in ROWS]
    specs = [row for row in ROWS if row.name in names]
    with tempfile.TemporaryDirectory(prefix="gpu-speed-") as scratch:
        bench = Bench(Inputs(Path(scratch), shape), args.precision)
        import torch

        device = torch.cuda.get_device_name(0) if bench.cuda else "cpu"
        peak = peak_tflops(device, args.peak_tflops) if bench.cuda else None
        print(f"device {device}, peak {peak or 'n/a'} TFLOP/s, {shape.rows} rows x "
              f"{shape.seq_len} tokens a step, steps {shape.timed_from}-{shape.steps} timed, "
              f"{args.precision}", flush=True)  # fmt: skip
        done: dict[str, Result] = {}
        for spec in specs:
            result = run_row(bench, spec, peak, done)
            done[spec.name] = result
            print(line(result), flush=True)
        env = environment(bench, peak)
    targets = target_lines(done)
    for text, figures, passed in targets:
        print(f"target {text}: {figures}: {VERDICT[passed]}")
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "environment": env,
        "rows": [asdict(r) for r in done.values()],
        "targets": [{"target": t, "figures": f, "met": p} for t, f, p in targets],
    }
    (args.out / "gpu_speed.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / "gpu_speed.md").write_text(markdown(list(done.values()), targets, env))
    print(f"results written to {args.out}/gpu_speed.json and gpu_speed.md")
    return 1 if any(r.error for r in done.values()) else 0


if __name__ == "__main__":  # Megatron's checkpoint writer spawns processes importing __main__
    sys.exit(main())
