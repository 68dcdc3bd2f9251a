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
  (``PLAIN_PATH`` in ``gpu_speed_parity.py``: ``--attention sdpa --cross-entropy full
  --compile-layers off --fused-optimizer off``), 4 rows in one micro-batch, the same rows, weights and seed; within
  ``PARITY_TOLERANCE`` (``gpu_speed_report.py``; bf16) relative;
* ``megatron-bare`` / ``megatron``: ``recipes/megatron_llama3_8b.py`` with a 0.55 B Llama
  ``--model-config`` (``--tp 1``, 1 x 4 micro-batches of ``--seq-len``): Megatron-Core's
  step in a bare loop (``native.py``'s) and driven by baton.

MFU = tokens a step x (6 x parameters + 6 x layers x seq_len x attention width, causal
attention) / seconds a step / the device's datasheet dense bf16 peak (``PEAK_TFLOPS`` in
``gpu_speed_measure.py``; ``--peak-tflops`` for another device; on a CPU MFU is ``n/a``).
Peak memory is ``torch.cuda.max_memory_allocated()``, reset before each row. ``paths``
are what the row ran: for baton's rows the paths its run recorded in its settings
(attention, cross entropy, compile, fused optimizer), ``n/a`` where none is recorded.

A row that fails prints its error on its line (the traceback on stderr) and the others
run. Then one line per target, and ``gpu_speed.json`` and ``gpu_speed.md`` under ``--out``.

The parts: ``gpu_speed_inputs.py`` (what the rows train on), ``gpu_speed_setting.py``
(what every row runs under), ``gpu_speed_measure.py`` (the timed window, MFU, a row's
result), the rows by what they drive (``gpu_speed_hand_loop.py``, ``gpu_speed_trl.py``,
``gpu_speed_baton.py``, ``gpu_speed_parity.py``, ``gpu_speed_megatron_bare.py``) and
``gpu_speed_report.py`` (the lines, the targets, the files); here, the command line and
the rows in the order they run.

Example::

    python benchmarks/gpu_speed.py --tiny --only hand-loop --only fabric-sft-1x4 --out /tmp/g
    # hand-loop          0.0213 s/step  MFU n/a  peak n/a  paths attention=sdpa ...
    # fabric-sft-1x4     0.0231 s/step  1.08x hand-loop  MFU n/a  ...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(HERE)]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_speed_baton import fabric_dpo, fabric_sft_1x4, fabric_sft_4x1, megatron  # noqa: E402
from benchmarks.gpu_speed_hand_loop import hand_loop  # noqa: E402
from benchmarks.gpu_speed_inputs import REAL, TINY, Inputs, Shape  # noqa: E402
from benchmarks.gpu_speed_measure import Measured, Result, measure_row, peak_tflops  # noqa: E402
from benchmarks.gpu_speed_megatron_bare import megatron_bare  # noqa: E402
from benchmarks.gpu_speed_parity import fabric_dpo_parity, fabric_sft_parity  # noqa: E402
from benchmarks.gpu_speed_report import (  # noqa: E402
    VERDICT,
    environment,
    line,
    target_lines,
    write_results,
)
from benchmarks.gpu_speed_setting import Setting  # noqa: E402
from benchmarks.gpu_speed_trl import (  # noqa: E402
    trl_dpo_defaults,
    trl_dpo_matched,
    trl_sft_defaults,
    trl_sft_matched,
)


@dataclass(frozen=True)
class RowSpec:
    name: str
    title: str
    run: Callable[[Setting], Measured]
    #: rows this one's time is compared with (``Nx name`` on its line)
    against: tuple[str, ...] = ()


ROWS: tuple[RowSpec, ...] = (
    RowSpec("hand-loop", "a hand-written loop, same rows and layout (1 x 4)", hand_loop),
    RowSpec("trl-sft-defaults", "TRL SFTTrainer, its defaults (gradient checkpointing on)",
            trl_sft_defaults),
    RowSpec("trl-sft-matched", "TRL SFTTrainer, bfd, pad to 64, no checkpointing",
            trl_sft_matched),
    RowSpec("fabric-sft-1x4", "baton Fabric SFT, 1 row per micro-batch, 4 accumulated",
            fabric_sft_1x4, ("hand-loop", "trl-sft-matched", "trl-sft-defaults")),
    RowSpec("fabric-sft-4x1", "baton Fabric SFT, 4 rows in one micro-batch", fabric_sft_4x1,
            ("fabric-sft-1x4", "trl-sft-matched", "trl-sft-defaults")),
    RowSpec("trl-dpo-defaults", "TRL DPOTrainer, its defaults (live reference)",
            trl_dpo_defaults),
    RowSpec("trl-dpo-matched", "TRL DPOTrainer, reference precomputed, no checkpointing",
            trl_dpo_matched),
    RowSpec("fabric-dpo", "baton Fabric DPO, reference precomputed", fabric_dpo,
            ("trl-dpo-matched", "trl-dpo-defaults")),
    RowSpec("fabric-sft-parity", "baton Fabric SFT, first step: levers vs plain path",
            fabric_sft_parity),
    RowSpec("fabric-dpo-parity", "baton Fabric DPO, first step: levers vs plain path",
            fabric_dpo_parity),
    RowSpec("megatron-bare", "Megatron-Core, a bare loop over the same step", megatron_bare),
    RowSpec("megatron", "baton Megatron-Core (megatron_llama3_8b.py)", megatron,
            ("megatron-bare",)),
)  # fmt: skip
BY_NAME = {row.name: row for row in ROWS}


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
        import torch

        cuda = torch.cuda.is_available()
        setting = Setting(Inputs(Path(scratch), shape), args.precision, cuda)
        device = torch.cuda.get_device_name(0) if cuda else "cpu"
        peak = peak_tflops(device, args.peak_tflops) if cuda else None
        print(f"device {device}, peak {peak or 'n/a'} TFLOP/s, {shape.rows} rows x "
              f"{shape.seq_len} tokens a step, steps {shape.timed_from}-{shape.steps} timed, "
              f"{args.precision}", flush=True)  # fmt: skip
        done: dict[str, Result] = {}
        for spec in specs:
            baselines = {name: done[name] for name in spec.against if name in done}
            row = partial(spec.run, setting)
            result = measure_row(spec.name, spec.title, row, peak=peak, baselines=baselines)
            done[spec.name] = result
            print(line(result), flush=True)
        env = environment(shape, args.precision, cuda=cuda, peak=peak)
    targets = target_lines(done)
    for text, figures, passed in targets:
        print(f"target {text}: {figures}: {VERDICT[passed]}")
    write_results(args.out, list(done.values()), targets, env)
    print(f"results written to {args.out}/gpu_speed.json and gpu_speed.md")
    return 1 if any(r.error for r in done.values()) else 0


if __name__ == "__main__":  # Megatron's checkpoint writer spawns processes importing __main__
    sys.exit(main())
