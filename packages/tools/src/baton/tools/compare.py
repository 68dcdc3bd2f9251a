"""The same weights (a Llama, Qwen3 or Qwen3-MoE) on Fabric, TorchTitan, Megatron-Core and
MaxText, on identical tokens, with how far their per-step losses agree and the four loss
curves on one chart.

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
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from baton.callbacks.sinks.jsonl import FILE_NAME, read_jsonl
from baton.core.backend_descriptor import CompareRun, backend_descriptors
from baton.core.cli.objective_flags import declared_settings
from baton.core.errors import UsageError
from baton.core.lr_schedule import SHAPES, LRSchedule
from baton.core.model.spec import ModelSpec
from baton.core.objectives import OBJECTIVES, DataKind, ObjectiveRun, Setting, objective_named
from baton.core.objectives.registry import SHIPPED
from baton.tools.compare_model import (
    MOE_LOSSES,
    check_model,
    check_model_config,
    save_model,
    tiny_llama_spec,
)

#: where the backends' tiny recipes are found unless ``--recipes`` says otherwise
RECIPES = Path("recipes")
#: input files a post-training objective prepares (anything else: a prepared prefix)
CHAT_SUFFIXES = (".jsonl", ".parquet")


def compared() -> dict[str, CompareRun]:
    """The backends ``baton compare`` runs, each with how (its descriptor's
    ``CompareRun``), in the order backends are listed: the first is the reference."""
    return {d.name: d.compare for d in backend_descriptors() if d.compare is not None}


def compared_objectives() -> tuple[str, ...]:
    """What ``--objective`` may ask for: each registered objective that a compared backend
    declares, the shipped ones first (``pretrain``, ``sft``, ``dpo``, ``grpo``), then by
    name."""
    declared = {o for d in backend_descriptors() if d.compare is not None for o in d.objectives}
    shipped = [o.name for o in SHIPPED]
    ordered = [*shipped, *(n for n in OBJECTIVES.names() if n not in shipped)]
    return tuple(name for name in ordered if name in declared)


def setting_flags(objective: str, values: Mapping[str, Any]) -> list[str]:
    """The recipe flags of the given settings of ``objective`` (``--num-generations=4``,
    ``--reward=A --reward=B``, ``--reward-weights 1 0.5``, ``--no-FLAG``), after checking
    them with the objective's own checks (``UsageError``: one not its own, a bad value,
    or a combination it refuses)."""
    ObjectiveRun.of(objective, **values)
    declared = {s.name: s for s in objective_named(objective).settings}
    flags: list[str] = []
    for name, value in values.items():
        setting = declared[name]
        if setting.type is bool and not (setting.repeatable or setting.listed):
            flags.append(setting.flag if value else "--no-" + setting.flag[2:])
        elif setting.repeatable:
            flags += [f"{setting.flag}={item}" for item in value]
        elif setting.listed:
            flags += [setting.flag, *(str(item) for item in value)]
        else:
            flags.append(f"{setting.flag}={value}")
    return flags


def takes_objective(recipe: Path) -> bool:
    """Whether the recipe at ``recipe`` has an ``objective`` flag (post-training)."""
    from baton.core.cli.recipe_signature import read_signature

    signature = read_signature(recipe)
    return signature is not None and any(p.name == "objective" for p in signature.params)


def objective_backends(objective: str, recipes: Path) -> tuple[str, ...]:
    """The compared backends that declare ``objective`` and, past pretraining, whose recipe
    in ``recipes`` takes ``--objective``, in order."""
    declared = {d.name for d in backend_descriptors() if objective in d.objectives}

    def recipe_runs_it(run: CompareRun) -> bool:
        recipe = recipes / run.recipe
        return objective == "pretrain" or (recipe.is_file() and takes_objective(recipe))

    return tuple(b for b, run in compared().items() if b in declared and recipe_runs_it(run))


def prepare_posttrain_data(
    source: str, tokenizer: str, data_dir: Path, seq_len: int, objective: str = "sft"
) -> str:
    """The prefix of ``source`` for ``objective``: a ``.jsonl``/``.parquet`` prepared once
    by ``baton data prepare`` (conversations into ``data_dir/chat``, pairs into
    ``data_dir/preference``, packed into rows of ``seq_len`` inputs; prompts into
    ``data_dir/prompts``), or ``source`` itself, a prefix prepared for it. ``ValueError``
    (``DataError``) for data of another kind or rows of another width."""
    from baton.data.packed import PackedDataset, check_objective

    kind = objective_named(objective).data
    if Path(source).suffix in CHAT_SUFFIXES:
        prefix = data_dir / ("chat" if kind == DataKind.CONVERSATIONS else kind.value)
        if kind == DataKind.PROMPTS:
            from baton.tools.data.prompts import prepare_prompts

            prepare_prompts([source], tokenizer, prefix, force=True)
        else:
            from baton.tools.data.posttrain import prepare_posttrain

            prepare_posttrain([source], tokenizer, prefix, seq_len=seq_len, force=True)
        return str(prefix)
    check_objective(source, objective)
    if kind == DataKind.PROMPTS:
        return source
    width = PackedDataset(source).seq_len
    if width != seq_len:
        raise ValueError(
            f"--data-path {source} holds rows of {width} tokens, --seq-len is {seq_len}; "
            f"pass --seq-len {width}"
        )
    return source


def prepare_reference(data_dir: Path, vocab_size: int) -> tuple[str, str]:
    """A tokenizer and a prepared dataset of the Python language reference, made once."""
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    tokenizer, prefix = data_dir / "tokenizer", data_dir / "reference"
    if not (tokenizer / "tokenizer.json").is_file():
        train_tokenizer(tokenizer, vocab_size=vocab_size)
    if not Path(f"{prefix}.idx").is_file():
        source = data_dir / "reference.jsonl"
        with source.open("w", encoding="utf-8") as out:
            for document in reference_documents():
                out.write(json.dumps({"text": document}) + "\n")
        prepare([source], tokenizer, prefix, workers=1, force=True)
    return str(prefix), str(tokenizer)


def backend_command(
    backend: str,
    run_dir: Path,
    *,
    init_from: str,
    data_path: str,
    tokenizer: str,
    steps: int,
    seq_len: int,
    batch: int,
    lr: float,
    warmup_steps: int = 0,
    min_lr: float | None = None,
    recipes: Path = RECIPES,
    objective: str = "pretrain",
    lr_schedule: str = "cosine",
    objective_flags: Sequence[str] = (),
) -> list[str]:
    """``python -m baton.core.cli.command run <backend's recipe> --init-from ...`` with the shared
    settings: the same schedule flags on every recipe (``min_lr`` None: ``lr / 10``;
    ``--objective sft``: on packed rows of ``seq_len`` inputs), the objective's settings
    (``objective_flags``: ``setting_flags``), then the recipe's own flags (its
    descriptor's ``CompareRun``)."""
    common = [
        f"--init-from={init_from}",
        f"--max-steps={steps}",
        f"--lr={lr}",
        f"--lr-schedule={lr_schedule}",
        f"--warmup-steps={min(warmup_steps, steps)}",
        f"--min-lr={lr / 10 if min_lr is None else min_lr}",
        f"--data-path={data_path}",
        f"--tokenizer={tokenizer}",
        f"--run-dir={run_dir / backend}",
        "--log-every=1",
        "--save-every=0",
        "--overwrite",
    ]
    if objective != "pretrain":
        common.append(f"--objective={objective}")
    common += objective_flags
    run = compared()[backend]
    own = run.command_flags(seq_len=seq_len, batch=batch, steps=steps)
    recipe = recipes / run.recipe
    return [sys.executable, "-m", "baton.core.cli.command", "run", str(recipe), *common, *own]


def losses(run_dir: Path) -> list[float]:
    """The training losses a run logged, in step order."""
    return [r["loss"] for r in read_jsonl(run_dir / "logs" / FILE_NAME) if "loss" in r]


def max_relative_difference(values: Sequence[float], reference: Sequence[float]) -> float:
    """The largest ``|value - reference| / |reference|`` over the steps both logged."""
    pairs = list(zip(values, reference, strict=False))
    if not pairs:
        return math.nan
    return max(abs(v - r) / abs(r) for v, r in pairs)


def agreement_table(
    runs: dict[str, list[float]], wall: dict[str, float], expect: dict[str, str] | None = None
) -> str:
    """Each run's first and final loss and its largest per-step relative difference
    from the first run's losses; then, from ``expect``, what each backend's loss holds
    (a mixture-of-experts model: ``MOE_LOSSES``)."""
    reference_name, reference = next(iter(runs.items()))
    head = f"{'backend':<12}{'steps':>6}{'first loss':>12}{'final loss':>12}"
    lines = [head + f"{'max rel diff vs ' + reference_name:>26}{'wall s':>8}"]
    for backend, values in runs.items():
        first, last = (values[0], values[-1]) if values else (math.nan, math.nan)
        diff = max_relative_difference(values, reference)
        lines.append(
            f"{backend:<12}{len(values):>6}{first:>12.4f}{last:>12.4f}{diff:>26.2e}"
            f"{wall.get(backend, math.nan):>8.0f}"
        )
    if expect:
        lines.append("differences to expect (each backend's own loss):")
        lines += [f"  {backend}: {expect[backend]}" for backend in runs if backend in expect]
    return "\n".join(lines)


def per_step_table(runs: dict[str, list[float]]) -> str:
    """Each step's loss on every run, one row a step (blank where a run logged none)."""
    lines = ["step" + "".join(f"{backend:>16}" for backend in runs)]
    for step in range(max((len(values) for values in runs.values()), default=0)):
        cells = [f"{v[step]:>16.8f}" if step < len(v) else " " * 16 for v in runs.values()]
        lines.append(f"{step + 1:<4}" + "".join(cells))
    return "\n".join(lines)


def first_step_table(runs: dict[str, list[float]]) -> str:
    """Each run's first-step loss and its relative difference from the first run's."""
    reference_name, reference = next(iter(runs.items()))
    base = reference[0] if reference else math.nan
    lines = [f"{'backend':<12}{'first-step loss':>18}{'rel diff vs ' + reference_name:>24}"]
    for backend, values in runs.items():
        first = values[0] if values else math.nan
        lines.append(f"{backend:<12}{first:>18.8f}{abs(first - base) / abs(base):>24.2e}")
    return "\n".join(lines)


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
    _check_arguments(backends, data_path, tokenizer, recipes)
    _check_objective(backends, objective, recipes)
    posttrain = objective != "pretrain"
    if posttrain:
        _check_posttrain(backends, objective, data_path, tokenizer, recipes)
    shape = {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq_len}
    _check_model_choice(init_from, model_config, shape)  # before any data is prepared
    decay = objective_named(objective).lr_schedule if lr_schedule is None else lr_schedule
    schedule = shared_schedule(steps, lr, warmup_steps, min_lr, decay)
    root = Path(run_dir)
    if posttrain:
        assert data_path is not None and tokenizer is not None  # _check_posttrain
        data_path = prepare_posttrain_data(data_path, tokenizer, root / "data", seq_len, objective)
        print(f"data: {data_path} ({data_layout(data_path)}), tokenizer {tokenizer}", flush=True)
    elif data_path is None or tokenizer is None:
        data_path, tokenizer = prepare_reference(root / "data", vocab_size)
        print(f"data: {data_path} (Python reference), tokenizer {tokenizer}", flush=True)
    init_from = _starting_model(init_from, model_config, tokenizer, root / "model", shape)
    print(f"schedule on every backend: {schedule.summary()}", flush=True)
    settings = {"init_from": init_from, "data_path": data_path, "tokenizer": tokenizer,
                "steps": steps, "seq_len": seq_len, "batch": batch, "lr": lr,
                "warmup_steps": schedule.warmup_steps, "min_lr": schedule.floor,
                "recipes": recipes, "objective": objective,
                "lr_schedule": schedule.decay, "objective_flags": objective_flags}  # fmt: skip
    wall, failed = _run_backends(backends, root, settings)
    moe = ModelSpec.from_hf(init_from).moe is not None
    print(f"\nschedule on every backend: {schedule.summary()}")
    _report(
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


def data_layout(prefix: str) -> str:
    """What the prepared post-training data at ``prefix`` holds: prompts, or packed rows
    (``packed_rows``)."""
    from baton.data.packed import data_objective

    kind = data_objective(prefix)
    if kind == DataKind.PROMPTS.value:
        from baton.data.prompts import PreparedPrompts

        return f"{len(PreparedPrompts(prefix))} prompts"
    return packed_rows(prefix, "conversations" if kind == DataKind.CONVERSATIONS else "documents")


def packed_rows(prefix: str, noun: str = "conversations") -> str:
    """How the packed ``noun`` at ``prefix`` are laid out, and that every backend trains
    on all of them (none held out)."""
    from baton.data.packed import PackedDataset

    data = PackedDataset(prefix)
    return (
        f"{data.num_sequences} {noun} packed in {data.num_rows} rows; every backend "
        f"trains on all {data.num_rows} rows, none held out"
    )


def _check_model_choice(
    init_from: str | None, model_config: str | None, shape: dict[str, int]
) -> None:
    """``ValueError`` (or ``UsageError``) for a model ``compare`` could not start from:
    both ``--init-from`` and ``--model-config``, or either one unreadable, or a bad shape."""
    if init_from is not None and model_config is not None:
        raise ValueError(
            "pass --init-from (weights to start from) or --model-config (a config.json to "
            "write random weights for), not both"
        )
    if init_from is not None:
        check_model(init_from, 0)
    elif model_config is not None:
        check_model_config(model_config, 0)
    else:
        tiny_llama_spec(**shape, vocab_size=1)


def _starting_model(
    init_from: str | None,
    model_config: str | None,
    tokenizer: str,
    directory: Path,
    shape: dict[str, int],
) -> str:
    """``init_from``, or the model of ``model_config`` (else a tiny Llama of ``shape`` for
    the tokenizer) saved in ``directory``, checked against the tokenizer's vocabulary."""
    from baton.data import load_tokenizer

    tokenizer_vocab = load_tokenizer(tokenizer).vocab_size
    if init_from is None:
        if model_config is not None:
            spec = check_model_config(model_config, tokenizer_vocab)
        else:
            spec = tiny_llama_spec(**shape, vocab_size=tokenizer_vocab)
        init_from = str(save_model(spec, directory))
    spec = check_model(init_from, tokenizer_vocab)
    experts = "" if spec.moe is None else f", {spec.moe.num_experts} experts"
    print(
        f"model: {init_from} ({spec.family}, {spec.num_layers} layers, width "
        f"{spec.hidden_size}, {spec.num_heads} heads{experts}, vocabulary "
        f"{spec.vocab_size}); every backend starts there",
        flush=True,
    )
    return init_from


def _check_arguments(
    backends: Sequence[str], data_path: str | None, tokenizer: str | None, recipes: Path
) -> None:
    """``ValueError`` for unknown backends, data without its tokenizer, missing recipes."""
    runs = compared()
    unknown = [b for b in backends if b not in runs]
    if unknown or not backends:
        raise ValueError(
            f"--backends {' '.join(backends) or '(none)'}: choose from {' '.join(runs)}"
        )
    if (data_path is None) != (tokenizer is None):
        raise ValueError(
            "pass both --data-path (a `baton data prepare` prefix) and --tokenizer (the "
            "directory it was prepared with), or neither to prepare the Python reference"
        )
    missing = [runs[b].recipe for b in backends if not (recipes / runs[b].recipe).is_file()]
    if missing:
        raise ValueError(
            f"--recipes {recipes} lacks {', '.join(missing)}; run from the project's root "
            "or pass --recipes PATH/TO/recipes"
        )


def _check_posttrain(
    backends: Sequence[str],
    objective: str,
    data_path: str | None,
    tokenizer: str | None,
    recipes: Path,
) -> None:
    """``ValueError`` for a post-training comparison without its data and their tokenizer,
    or on a backend whose recipe has no ``--objective``."""
    if data_path is None or tokenizer is None:
        kind = objective_named(objective).data
        made = "" if kind == DataKind.PROMPTS else " --seq-len"
        raise ValueError(
            f"--objective {objective} needs --data-path ({kind.described}: a .jsonl/.parquet, "
            f"or a prefix from `baton data prepare{made}`) and --tokenizer (with its chat "
            "template)"
        )
    runs = compared()
    without = [b for b in backends if not takes_objective(recipes / runs[b].recipe)]
    if without:
        raise ValueError(
            f"--objective {objective}: the recipe of {' '.join(without)} has no --objective; "
            f"choose from {' '.join(objective_backends(objective, recipes)) or '(none)'}"
        )


def _check_objective(backends: Sequence[str], objective: str, recipes: Path) -> None:
    """``ValueError`` for a backend whose descriptor does not name ``objective``."""
    declared = {d.name: d.objectives for d in backend_descriptors()}
    others = [b for b in backends if objective not in declared[b]]
    if others:
        raise ValueError(
            f"--objective {objective}: {' '.join(others)} does not train it (its backend "
            f"declares {', '.join(declared[others[0]])}); choose from "
            f"{' '.join(objective_backends(objective, recipes)) or '(none)'}"
        )


def _run_backends(
    backends: Sequence[str], root: Path, settings: dict[str, Any]
) -> tuple[dict[str, float], list[str]]:
    """Each backend's recipe in its own process (output in ``root/<backend>.log``); the
    wall time of each and the failures."""
    wall: dict[str, float] = {}
    failed: list[str] = []
    for backend in backends:
        command = backend_command(backend, root, **settings)
        log = root / f"{backend}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"{backend}: running (output in {log})", flush=True)
        start = time.perf_counter()
        with log.open("w", encoding="utf-8") as out:
            out.write(" ".join(command) + "\n")
            out.flush()
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
        wall[backend] = time.perf_counter() - start
        if code != 0:
            failed.append(f"{backend} (exit {code}, see {log})")
        print(f"{backend}: exit {code} after {wall[backend]:.0f} s", flush=True)
    return wall, failed


def _report(
    backends: Sequence[str],
    root: Path,
    wall: dict[str, float],
    expect: dict[str, str] | None,
    *,
    first_step: bool = False,
    per_step: bool = False,
) -> None:
    """The agreement table and the loss charts of the backends that finished (and, with
    ``first_step``, their first-step losses to more digits; with ``per_step``, each
    step's loss on every backend)."""
    finished = [b for b in backends if (root / b / "logs" / FILE_NAME).is_file()]
    if finished:
        from baton.tools.plot import plot_runs

        charts = plot_runs([root / b for b in finished], root / "comparison")
        runs = {b: losses(root / b) for b in finished}
        print("\n" + agreement_table(runs, wall, expect))
        if first_step:
            print("\n" + first_step_table(runs))
        if per_step:
            print("\n" + per_step_table(runs))
        print("charts: " + ", ".join(str(path) for path in charts))


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
