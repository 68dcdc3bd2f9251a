"""The same weights (a Llama, Qwen3 or Qwen3-MoE) on Fabric, TorchTitan, Megatron-Core and
MaxText, on identical tokens, with how far their per-step losses agree and the four loss
curves on one chart.

Example::

    uv run baton compare                                  # zero setup, ~5 min on CPU
    uv run baton compare --steps 100 --backends megatron maxtext
    uv run baton compare --data-path data/corpus --tokenizer runs/tok
    uv run baton compare --init-from hf_models/tiny-llama  # a save_pretrained model of yours
    uv run baton compare --model-config qwen3_moe.json      # its model, random weights

Without ``--data-path``/``--tokenizer`` it trains a byte-level BPE (``--vocab-size``
tokens) on the Python language reference and prepares that text once with it (``baton
data prepare``), under ``<run-dir>/data``; a second run reuses both. Without
``--init-from`` it writes the model of ``--model-config`` (a ``config.json``, built by
``transformers``' own class), else one Llama (``--layers/--hidden/--heads``, SwiGLU
width ``8/3 x hidden`` rounded up to 256, the tokenizer's vocabulary rounded up to 128),
randomly initialised in fp32, with ``save_pretrained`` to ``<run-dir>/model``. Each
backend then runs its own recipe from ``--recipes`` (the project's ``recipes/``) with
``--init-from`` that directory, in its own process (``baton run``: a backend owns its
process group or JAX runtime), on that dataset and tokenizer with the same steps, batch,
sequence length and learning-rate schedule, into ``<run-dir>/<backend>`` (its output in
``<run-dir>/<backend>.log``): Fabric ``hf_finetune.py`` (``transformers``' own model
class), TorchTitan ``torchtitan_llama3_debug.py`` (its llama3 or qwen3 model),
Megatron-Core ``megatron_gpt_tiny.py`` (GPTModel, with MoE layers for a Qwen3-MoE),
MaxText ``maxtext_tiny.py`` (its ``llama2``, ``qwen3`` or ``qwen3_moe`` decoder block,
``dtype=float32``); each backend's descriptor declares its recipe and the recipe's own
flags (``BackendDescriptor.compare``), so a backend that declares one is compared too.
All four start from the same weights, in fp32. The loss curves land
in ``<run-dir>/comparison/loss.png`` (``baton plot`` with the run directories) and a
table prints each backend's first and final loss and the largest relative difference of
its per-step losses from the first backend's.

Every backend runs one learning-rate schedule (``baton.core.lr_schedule``), given
through the recipes' flags ``--lr``, ``--lr-schedule``, ``--warmup-steps`` and
``--min-lr``: linear warmup over ``--warmup-steps`` to ``--lr``, then the rate held
(``constant``) or decayed (``linear``, ``cosine``) to ``--min-lr`` (default a tenth of
``--lr``) at the last step; by default the objective's schedule (cosine for pretraining,
constant for SFT) with a warmup of a tenth of the steps when it decays. It is printed
before the runs and before the table, and each step logs the same ``lr`` on all four,
so the losses differ by no schedule.

Where the four still differ (each recipe keeps its backend's own choices):

- Each backend's own data pipeline cuts and orders the samples (Megatron's
  ``GPTDataset`` shuffles, MaxText's Grain reads its own order, TorchTitan reads windows
  in order with positions restarting after each end-of-document token, Fabric shuffles
  its windows with its seed): the same tokens, not the same batches in the same order,
  so per-step losses agree only as closely as different batches of one text allow.
  (On one fixed batch the four compute the same first-step loss within 3e-7 relative:
  tests/backends/test_round_trip.py.)
- AdamW settings (betas, epsilon, weight decay, clipping) are each backend's own.
  Fabric's sequences are one token longer (its model shifts the labels itself), so
  every backend predicts ``--seq-len`` targets a sample.
- A mixture-of-experts model's loss is each backend's own: the load-balancing term is in
  Fabric's and MaxText's logged loss (each its own formula), in Megatron-Core's gradient
  only, and TorchTitan adds none (``MOE_LOSSES``, printed under the table).

Supervised fine-tuning (``--objective sft``) runs each recipe with ``--objective sft`` on
conversations packed once by ``baton data prepare --seq-len`` (``--data-path`` a chat
``.jsonl``/``.parquet``, prepared into ``<run-dir>/data/chat`` with ``--tokenizer``,
whose chat template renders it; or a prefix already prepared that way), and prints each
backend's first-step loss and its relative difference from the first backend's::

    uv run baton compare --objective sft --data-path chat.jsonl --tokenizer hf_model \
        --init-from hf_model --seq-len 512 --batch 8 --backends fabric megatron

The loss is the mean over the step's supervised tokens on every backend. No backend holds
rows out (nothing is held out unless a run asks with ``--eval-split`` or
``--eval-data-path``), so every backend trains on every row: when ``--batch`` holds every
row of the data every backend's first step reads the same rows, and the first-step
losses agree within 1e-5 relative; otherwise each backend's own order picks the rows of
a step. The data line says how many rows there are. Without ``--backends`` it runs the
backends that declare the objective and whose recipe takes ``--objective``.

``--objective`` takes any registered objective (``baton.core.objectives.OBJECTIVES``) that
a compared backend declares (``BackendDescriptor.objectives``): ``pretrain``, ``sft``,
``dpo``, ``grpo`` and a package's own. Every objective's settings are flags of ``baton
compare`` too (``--num-generations``, ``--reward``, ``--dpo-beta``, ``--reference``, ...,
read from the declarations); those given are checked once, before anything is prepared,
and handed to every backend's recipe. A post-training objective's ``--data-path`` is a
``.jsonl``/``.parquet`` prepared once by ``baton data prepare`` into
``<run-dir>/data/<kind>`` (conversations and pairs packed into rows of ``--seq-len``,
prompts one a record), or a prefix already prepared for it.

GRPO (``--objective grpo``) trains each backend on completions sampled for the prepared
prompts and scored by ``--reward``; ``--batch`` is the rollouts of a step (prompts x
``--num-generations``) and ``--seq-len`` must hold the longest prompt and completion.
With ``--generator recorded:FILE.jsonl`` (a run's ``logs/rollouts.jsonl``) every backend
trains on the same completions with the same sampling log-probabilities, so from one
starting model their first-step losses agree as closely as float32 allows (within 1e-5
relative on CPU); ``--num-iterations N`` trains those rollouts for ``N`` steps::

    uv run baton compare --objective grpo --data-path prompts.jsonl --tokenizer hf_model \
        --init-from hf_model --generator recorded:rollouts.jsonl --reward my_rewards.py:fn \
        --num-generations 4 --batch 16 --seq-len 40 --steps 2 --num-iterations 2

A post-training comparison prints each backend's first-step loss and its relative
difference from the first backend's; one that samples rollouts (GRPO), whose losses sit
near zero where relative differences say little, then prints each step's loss on every
backend.

The parts live beside this module: ``compare_backends`` (which backends run and the
command each runs), ``compare_checks`` (the arguments checked before anything is
prepared), ``compare_data`` (the data prepared), ``compare_model`` (the model every
backend starts from) and ``compare_report`` (the tables and charts from the runs' logs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from baton.core.cli.objective_flags import declared_settings
from baton.core.errors import UsageError
from baton.core.lr_schedule import SHAPES, LRSchedule
from baton.core.model.spec import ModelSpec
from baton.core.objectives import Setting, objective_named
from baton.tools.compare_backends import (
    RECIPES,
    backend_command,
    compared,
    compared_objectives,
    objective_backends,
    run_backends,
    setting_flags,
    takes_objective,
)
from baton.tools.compare_checks import check_arguments, check_objective, check_posttrain
from baton.tools.compare_data import (
    CHAT_SUFFIXES,
    data_layout,
    packed_rows,
    prepare_comparison_data,
    prepare_posttrain_data,
    prepare_reference,
)
from baton.tools.compare_model import MOE_LOSSES, check_model_choice, starting_model
from baton.tools.compare_report import (
    agreement_table,
    first_step_table,
    losses,
    max_relative_difference,
    per_step_table,
    report,
)

__all__ = [
    "CHAT_SUFFIXES",
    "RECIPES",
    "agreement_table",
    "backend_command",
    "compare",
    "compared",
    "compared_objectives",
    "data_layout",
    "first_step_table",
    "losses",
    "main",
    "max_relative_difference",
    "objective_backends",
    "packed_rows",
    "per_step_table",
    "prepare_posttrain_data",
    "prepare_reference",
    "setting_flags",
    "shared_schedule",
    "takes_objective",
]


def compare(
    steps: int = 50,
    layers: int = 6,
    hidden: int = 256,
    heads: int = 16,
    seq_len: int = 128,
    batch: int = 4,
    lr: float = 1e-3,
    lr_schedule: str | None = None,
    warmup_steps: int | None = None,
    min_lr: float | None = None,
    vocab_size: int = 2048,
    data_path: str | None = None,
    tokenizer: str | None = None,
    init_from: str | None = None,
    model_config: str | None = None,
    backends: tuple[str, ...] | None = None,
    run_dir: str = "runs/compare_backends",
    recipes: str | Path = RECIPES,
    objective: str = "pretrain",
    objective_settings: Mapping[str, Any] | None = None,
) -> None:
    """Train the same weights on each backend on the same tokens; compare the losses.

    Args:
        steps: optimizer steps on each backend.
        layers: transformer layers of the model built without --init-from.
        hidden: its width.
        heads: its attention heads (query and key/value).
        seq_len: tokens per sample.
        batch: samples per step.
        lr: peak learning rate (after warmup).
        lr_schedule: after the warmup, on every backend: constant, linear or cosine decay
            (None: the objective's, cosine for pretrain and constant for sft).
        warmup_steps: steps of linear warmup on every backend (None: a tenth of --steps
            under a decaying schedule, none under a constant one).
        min_lr: the learning rate every backend's decay ends at, at the last step
            (None: --lr / 10).
        vocab_size: the BPE trained when no --tokenizer is given.
        data_path: a prepared prefix (`baton data prepare`); with --tokenizer.
        tokenizer: the tokenizer directory the data was prepared with.
        init_from: a Hugging Face model directory (save_pretrained) all backends start
            from (None: one written from --model-config, else a tiny Llama built from
            --layers/--hidden/--heads).
        model_config: a Llama, Qwen3 or Qwen3-MoE config.json (or its directory) whose
            model is written with random weights for all backends to start from.
        backends: which backends to run, in order (the first is the reference; None:
            every compared backend that declares the objective, for sft those whose
            recipe takes --objective).
        run_dir: where the data, the model, each backend's run and the chart go.
        recipes: the directory holding each backend's recipe.
        objective: a registered objective a compared backend declares
            (``compared_objectives``): pretrain (next token over text), or a
            post-training one (sft, dpo, grpo: --data-path a .jsonl/.parquet or a prefix
            prepared for it, and --tokenizer).
        objective_settings: values of the objective's settings (``num_generations``,
            ``reward``, ...), checked here and given to every backend.
    """
    recipes = Path(recipes)
    choices = compared_objectives()
    if objective not in choices:
        raise ValueError(f"--objective {objective}: choose from {' '.join(choices)}")
    objective_flags = setting_flags(objective, objective_settings or {})
    if backends is None:
        backends = objective_backends(objective, recipes)
    check_arguments(backends, data_path, tokenizer, recipes)
    check_objective(backends, objective, recipes)
    posttrain = objective != "pretrain"
    if posttrain:
        check_posttrain(backends, objective, data_path, tokenizer, recipes)
    shape = {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq_len}
    check_model_choice(init_from, model_config, shape)  # before any data is prepared
    decay = objective_named(objective).lr_schedule if lr_schedule is None else lr_schedule
    schedule = shared_schedule(steps, lr, warmup_steps, min_lr, decay)
    root = Path(run_dir)
    data_path, tokenizer = prepare_comparison_data(
        objective, data_path, tokenizer, root / "data", seq_len=seq_len, vocab_size=vocab_size
    )
    init_from = starting_model(init_from, model_config, tokenizer, root / "model", shape)
    print(f"schedule on every backend: {schedule.summary()}", flush=True)
    settings = {"init_from": init_from, "data_path": data_path, "tokenizer": tokenizer,
                "steps": steps, "seq_len": seq_len, "batch": batch, "lr": lr,
                "warmup_steps": schedule.warmup_steps, "min_lr": schedule.floor,
                "recipes": recipes, "objective": objective,
                "lr_schedule": schedule.decay, "objective_flags": objective_flags}  # fmt: skip
    wall, failed = run_backends(backends, root, settings)
    moe = ModelSpec.from_hf(init_from).moe is not None
    print(f"\nschedule on every backend: {schedule.summary()}")
    report(
        backends,
        root,
        wall,
        MOE_LOSSES if moe else None,
        first_step=posttrain,
        per_step=objective_named(objective).rollouts,
    )
    if failed:
        raise RuntimeError("backends failed: " + "; ".join(failed))


def shared_schedule(
    steps: int,
    lr: float,
    warmup_steps: int | None = None,
    min_lr: float | None = None,
    lr_schedule: str = "cosine",
) -> LRSchedule:
    """The one schedule every backend runs: warmup (default a tenth of ``steps`` when the
    rate decays, none when it is constant) to ``lr``, then ``lr_schedule`` to ``min_lr``
    (default ``lr / 10``) at ``steps``.

    >>> shared_schedule(50, 1e-3).summary()
    'warmup 5 steps to lr 0.001, cosine decay to 0.0001 at step 50'
    """
    if lr_schedule not in SHAPES:
        raise ValueError(f"--lr-schedule {lr_schedule}: choose from {' '.join(SHAPES)}")
    default = 0 if lr_schedule == "constant" else steps // 10
    warmup = default if warmup_steps is None else min(warmup_steps, steps)
    if warmup < 0 or (min_lr is not None and not 0 <= min_lr <= lr):
        raise ValueError(
            f"--warmup-steps {warmup_steps} / --min-lr {min_lr}: the warmup must be at "
            f"least 0 and --min-lr between 0 and --lr ({lr:g})"
        )
    return LRSchedule(lr, lr / 10 if min_lr is None else min_lr, warmup, steps, lr_schedule)


def main(argv: Sequence[str] | None = None) -> int:
    """``baton compare``: the arguments of ``compare`` as flags; 2 on bad input, 1 when a
    backend's run failed."""
    parser = argparse.ArgumentParser(prog="baton compare", description=compare.__doc__)
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps on each backend")
    parser.add_argument("--layers", type=int, default=6, help="layers of the model built")
    parser.add_argument("--hidden", type=int, default=256, help="width of the model built")
    parser.add_argument("--heads", type=int, default=16, help="heads of the model built")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sample")
    parser.add_argument("--batch", type=int, default=4, help="samples per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument(
        "--lr-schedule",
        choices=SHAPES,
        default=None,
        help="after the warmup, on every backend (default: cosine for pretrain, constant for sft)",
    )
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="steps of linear warmup on every backend (default: a tenth of --steps when "
        "the rate decays, none when it is constant)",
    )
    parser.add_argument(
        "--min-lr",
        type=float,
        default=None,
        help="where every backend's decay ends, at the last step (default: --lr / 10)",
    )
    parser.add_argument("--vocab-size", type=int, default=2048, help="the BPE trained if needed")
    parser.add_argument("--data-path", default=None, help="a `baton data prepare` prefix")
    parser.add_argument("--tokenizer", default=None, help="the tokenizer it was prepared with")
    parser.add_argument(
        "--init-from", default=None, help="a Hugging Face model directory all backends start from"
    )
    parser.add_argument(
        "--model-config",
        default=None,
        help="a Llama, Qwen3 or Qwen3-MoE config.json: its model, random weights, for all",
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        default=None,
        help="which, in order (default: all four; for sft those whose recipe takes it)",
    )
    parser.add_argument(
        "--objective",
        choices=compared_objectives(),
        default="pretrain",
        help="pretrain (text), or a post-training objective on --data-path (conversations, "
        "pairs or prompts: a .jsonl/.parquet or a prepared prefix)",
    )
    settings = parser.add_argument_group("objective settings (given to every backend)")
    for setting, owners in declared_settings().values():
        _add_setting(settings, setting, owners)
    parser.add_argument("--run-dir", default="runs/compare_backends", help="where results go")
    parser.add_argument("--recipes", default=str(RECIPES), help="the backends' recipes")
    args = parser.parse_args(argv)
    names = declared_settings()
    given = {k: v for k, v in vars(args).items() if k in names}
    try:
        compare(
            steps=args.steps,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            seq_len=args.seq_len,
            batch=args.batch,
            lr=args.lr,
            lr_schedule=args.lr_schedule,
            warmup_steps=args.warmup_steps,
            min_lr=args.min_lr,
            vocab_size=args.vocab_size,
            data_path=args.data_path,
            tokenizer=args.tokenizer,
            init_from=args.init_from,
            model_config=args.model_config,
            backends=None if args.backends is None else tuple(args.backends),
            run_dir=args.run_dir,
            recipes=args.recipes,
            objective=args.objective,
            objective_settings={
                k: tuple(v) if isinstance(v, list) else v for k, v in given.items()
            },
        )
    except (ValueError, UsageError) as error:
        print(f"baton compare: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"baton compare: {error}", file=sys.stderr)
        return 1
    return 0


def _add_setting(parser: Any, setting: Setting, owners: tuple[str, ...]) -> None:
    """``setting`` as a flag of ``baton compare`` (absent unless given)."""
    described = f"({', '.join(owners)}) {setting.help}"
    options: dict[str, Any] = {"default": argparse.SUPPRESS, "help": described}
    if setting.repeatable:
        options |= {"action": "append", "type": setting.type}
    elif setting.listed:
        options |= {"nargs": "+", "type": setting.type}
    elif setting.type is bool:
        options |= {"action": argparse.BooleanOptionalAction}
    elif setting.optional:
        options |= {"type": _optional(setting.type)}
    else:
        options |= {"type": setting.type}
    parser.add_argument(setting.flag, dest=setting.name, **options)


def _optional(kind: type) -> Any:
    """A parser of ``kind`` that reads ``None`` as None."""

    def parse(text: str) -> Any:
        return None if text == "None" else kind(text)

    parse.__name__ = kind.__name__
    return parse
