"""Fine-tune a Hugging Face causal LM from its weights (weights only: fresh optimizer, step 0).

uv run baton run recipes/hf_finetune.py --init-from tiny-llama --make-tiny-model
uv run baton run recipes/hf_finetune.py --init-from path/to/hf_model_dir --max-steps 200
uv run baton run recipes/hf_finetune.py --model-config tiny-llama/config.json  # from scratch
uv run baton export runs/hf_finetune/checkpoints/latest --format hf exported/

``--init-from DIR`` is a directory written by ``save_pretrained`` (``config.json`` and
``*.safetensors``); nothing is downloaded. ``--make-tiny-model`` first writes a randomly
initialised 2-layer Llama there (byte vocabulary) when the directory does not exist.
The architecture comes from ``--model-config`` (default: the same directory); weights
whose shapes differ from it are refused, naming the first parameter and both shapes.
A Llama, Qwen3 or Qwen3-MoE config is recorded as baton's model spec (resumes and
``--init-from`` checkpoints are compared with it). A Qwen3-MoE trains with its
load-balancing loss (``router_aux_loss_coef`` times ``transformers``' load-balancing
loss, added to the loss) and logs that term as ``moe/aux_loss`` and the expert load
balance as ``moe/load_balance``.
Without ``--tokenizer`` the model reads UTF-8 bytes (of ``--data-path``, else the Python
language reference); with it, ``--data-path`` is a prepared dataset or blend (``baton data
prepare``) or ``.jsonl``/``.parquet``/``.txt`` files, and the tokenizer's vocabulary must
fit the model's.

Post-training (``--objective NAME``: any objective ``baton.core.objectives`` declares
over prepared conversations or preference pairs, e.g. sft and dpo, or over prompts, grpo;
``--help`` lists them with their settings' flags) reads data packed by ``baton data
prepare --seq-len N`` with ``--data-path PREFIX --tokenizer DIR``; rows hold the data's
own ``seq_len``. Every row trains unless rows are held out for evaluation with
``--eval-split F`` (the last rows) or ``--eval-data-path PREFIX``; the evaluation is the
objective's loss over all of them (SFT: the mean over their supervised tokens; DPO: the
mean over their pairs, with TRL's metrics). Packed rows go to the model as ``input_ids``,
``position_ids`` restarting in each document (``transformers`` then keeps attention
inside each document) and labels of -100 where a token is not supervised. SFT keeps the
model's own cross entropy; any other objective's loss is its declared one, over the
targets' log-probabilities. A step's loss is the mean over the objective's items (the
supervised tokens of SFT, the pairs of DPO) of the global batch, every micro-batch and
rank, and so are its metrics (DPO: TRL's ``rewards/chosen``, ``rewards/margins``,
``logps/chosen``...). An objective with a stored reference (DPO: ``--dpo-beta``,
``--dpo-loss sigmoid|ipo``) compares against ``--reference`` (a Hugging Face directory or
checkpoint; default: the ``--init-from`` weights), whose log-probabilities are computed
once before training and stored beside the data (``PREFIX.reference-<fingerprint>.npy``).

uv run baton run recipes/hf_finetune.py --objective sft --init-from hf_model \
    --data-path data/chat --tokenizer hf_model
uv run baton run recipes/hf_finetune.py --objective dpo --init-from sft_export \
    --data-path data/pairs --tokenizer sft_export --dpo-beta 0.1

Speed on a GPU: ``--attention`` (``flex``: ``transformers``' ``flex_attention``, whose
block mask of the packed documents skips masked blocks), ``--compile-layers`` (each
decoder layer compiled), ``--fused-optimizer`` (AdamW's fused kernel) and
``--cross-entropy`` (``chunked``: a chunk of tokens' float32 logits at a time, in the
forward and the backward, from the decoder's last hidden states; ``fused``: Liger's fused
linear cross entropy for SFT and pretraining, ``liger_kernel`` on CUDA; ``full``: the
model's whole float32 logits) default to ``auto``: on a GPU, flex for post-training's
packed rows (sdpa for pretraining windows), compiled layers, the fused AdamW and the
chunked cross entropy (fused where Liger is installed); on a CPU, the plain paths (the
full logits also for a model other than Llama, Qwen3 or Qwen3-MoE). Where a path runs on
a CPU it gives the plain path's loss and gradient norm within 1e-6 in float32 (tested).
The run logs one line saying which paths run and records them in its settings
(``fast_paths``).

Online RL (``--objective grpo``: TRL's GRPO family) reads prompts prepared by ``baton data
prepare PROMPTS.jsonl``: before each step the first rank samples ``--num-generations``
completions of each prompt with a ``transformers`` model holding the policy's current
weights (gathered in memory by their Hugging Face names, no file written), scores them
with the ``--reward`` functions, and every rank trains its share of the rollouts. A step
trains ``--batch-size`` x ranks x ``--grad-accum`` rollouts (``--num-generations`` must
divide them); rows are ``--seq-len`` long, at least the longest prepared prompt (at most
``--max-prompt-length``) plus ``--max-completion-length``. Each step's rollouts go to
``logs/rollouts.jsonl``.

uv run baton run recipes/hf_finetune.py --objective grpo --init-from sft_export \
    --data-path data/prompts --tokenizer sft_export --reward rewards.py:correct \
    --num-generations 8 --batch-size 16 --max-completion-length 256 --seq-len 768
"""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from baton.backends.fabric import FabricBackend, FabricConfig
from baton.backends.fabric.cross_entropy import FULL, CrossEntropy, causal_lm_output
from baton.backends.fabric.fast_paths import FastPaths, run_device
from baton.backends.fabric.hf_posttrain import post_training
from baton.backends.fabric.lr_schedule import lambda_scheduler
from baton.backends.fabric.models.gpt import ByteWindows, byte_splits, eval_windows
from baton.backends.fabric.moe import with_moe_metrics
from baton.backends.fabric.online_rl import fabric_rollout_phase
from baton.backends.fabric.rollout_rows import RolloutRows
from baton.backends.fabric.text import text_loaders
from baton.callbacks import (
    Checkpoint,
    CompositeLogger,
    Progress,
    RolloutRecords,
    ThroughputMonitor,
)
from baton.callbacks.sinks.console import ConsoleSink
from baton.core import Callback, Driver
from baton.core.cli.dry_run import is_planning
from baton.core.errors import UsageError
from baton.core.lr_schedule import resolve_schedule
from baton.core.model.spec import FAMILIES, ModelSpec, check_init_from
from baton.core.objectives import DataKind, ObjectiveRun
from baton.data import resolve_tokenizer


def save_tiny_llama(directory: str | Path, seed: int = 0) -> Path:
    """A randomly initialised 2-layer Llama with a byte vocabulary, saved with
    ``save_pretrained`` (what a downloaded model directory looks like)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return Path(directory)


def as_lm_batch(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Byte windows as a causal-LM batch (the model shifts the labels itself)."""
    ids = torch.stack([torch.cat([x[:1], y]) for x, y in items])
    return {"input_ids": ids, "labels": ids}


def window_output(
    model: Any, batch: tuple[torch.Tensor, torch.Tensor], cross_entropy: CrossEntropy = FULL
) -> Any:
    """The model's output on token windows ``(x, y)`` (loss, and a MoE's router logits)."""
    ids = torch.cat([batch[0], batch[1][:, -1:]], dim=1)
    return causal_lm_output(model, ids, cross_entropy)


def row_output(model: Any, batch: dict[str, torch.Tensor], cross_entropy: CrossEntropy) -> Any:
    """The model's output on a causal-LM batch of rows (``as_lm_batch``)."""
    return causal_lm_output(model, batch["input_ids"], cross_entropy)


def byte_lm_data(seq_len: int, batch_size: int, seed: int, path: str | None) -> tuple[Any, Any]:
    train, val = byte_splits(path)
    loader = StatefulDataLoader(
        ByteWindows(train, seq_len - 1),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=as_lm_batch,
        generator=torch.Generator().manual_seed(seed),
    )
    fixed = eval_windows(val, seq_len=seq_len - 1, batch_size=batch_size, batches=4)
    return loader, [as_lm_batch(list(zip(x, y, strict=True))) for x, y in fixed]


def run_callbacks(
    keys: list[str], *, save_every: int, progress: bool, rollouts: bool = False
) -> list[Callback]:
    """This recipe's callbacks: checkpoints (the last two kept), throughput, the JSON Lines
    log and a console line of ``keys``, the progress bar, and on a run that samples
    rollouts their records (``logs/rollouts.jsonl``)."""
    return [
        Checkpoint(every_n_steps=save_every or None, keep_last=2),
        ThroughputMonitor(),
        CompositeLogger(["jsonl", ConsoleSink(keys)]),
        *([Progress()] if progress else []),
        *([RolloutRecords()] if rollouts else []),
    ]


def recipe(
    init_from: str | None = None,
    model_config: str | None = None,
    make_tiny_model: bool = False,
    max_steps: int = 100,
    lr: float = 1e-3,
    lr_schedule: str | None = None,
    min_lr: float | None = None,
    warmup_steps: int = 0,
    batch_size: int = 8,
    seq_len: int = 64,
    grad_accum: int = 1,
    grad_clip: float = 1.0,
    precision: str = "32-true",
    accelerator: str = "cpu",
    strategy: str = "auto",
    seed: int = 0,
    data_path: str | None = None,
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
    tokenizer: str | None = None,
    text_key: str = "text",
    log_every: int = 10,
    eval_every: int | None = None,
    save_every: int = 50,
    run_dir: str = "runs/hf_finetune",
    progress: bool = True,
    objective: ObjectiveRun | str = "pretrain",
    attention: str = "auto",
    compile_layers: str = "auto",
    fused_optimizer: str = "auto",
    cross_entropy: str = "auto",
) -> Driver:
    """Fine-tune the Hugging Face causal LM in --init-from on local text (or train the
    --model-config architecture from scratch).

    Args:
        init_from: a save_pretrained directory whose weights start the run (step 0).
        model_config: the architecture: a config.json or its directory (None: --init-from's).
        make_tiny_model: first write a random 2-layer byte Llama to a missing --init-from.
        max_steps: optimizer steps to train.
        lr: AdamW's peak learning rate (after warmup; no weight decay).
        lr_schedule: after the warmup: constant, linear or cosine decay to --min-lr at
            --max-steps (default: the objective's, cosine for pretrain, constant for the
            post-training objectives).
        min_lr: the learning rate a decay ends at, at --max-steps (default: --lr / 10).
        warmup_steps: steps of linear warmup (0: none; at most --max-steps).
        batch_size: sequences per step and rank (rollouts per micro-batch and rank for
            an objective that samples them).
        seq_len: tokens per sequence (for an objective that samples rollouts, at least
            the longest prompt and completion).
        grad_accum: micro-batches accumulated per optimizer step.
        grad_clip: gradient norm clipping threshold (0: no clipping).
        precision: Lightning precision: 32-true, bf16-mixed, 16-mixed.
        accelerator: cpu, cuda or auto.
        strategy: auto, ddp or fsdp (devices and nodes come from the launcher).
        seed: seed of the data order and of new weights (--make-tiny-model, from scratch).
        data_path: a text file (bytes), or with --tokenizer a prepared dataset, blend or
            .jsonl/.parquet/.txt files (None: the Python language reference).
        eval_split: with --tokenizer: the fraction of the documents (--objective sft,
            dpo: of the packed rows) held out for evaluation, the last ones (0: none;
            nothing is held out unless asked; byte runs evaluate on the text's tail).
        eval_data_path: with --tokenizer: evaluation data, the same kind as --data-path.
        tokenizer: a Hugging Face tokenizer directory (None: UTF-8 bytes).
        text_key: the text field of .jsonl/.parquet records.
        log_every: steps between log lines.
        eval_every: steps between evaluations (0: none; None: 50 where there is
            evaluation data, else none; an objective that samples rollouts holds nothing
            out).
        save_every: steps between checkpoints (0: only when the run stops).
        run_dir: where checkpoints and logs go.
        progress: show the progress bar.
        objective: what a step minimises: pretrain (next token over text), an objective
            over prepared conversations or pairs, or one over completions it samples from
            prepared prompts each step (grpo), with its settings' flags.
        attention: the model's attention: sdpa, flex (transformers' flex_attention: the
            packed documents' mask as a block mask that skips masked blocks; GPU only),
            eager, or auto (flex on a GPU for post-training's packed rows, else sdpa).
        compile_layers: torch.compile each decoder layer: on, off, or auto (on a GPU).
        fused_optimizer: AdamW's fused kernel: on, off, or auto (on a GPU).
        cross_entropy: how the loss reads the logits: chunked (a chunk of tokens'
            float32 logits at a time, in the forward and the backward), fused (SFT and
            pretraining by Liger's fused linear cross entropy: liger_kernel on CUDA;
            other objectives chunked), full (the model's whole float32 logits) or auto
            (on CUDA fused where liger_kernel is installed, else chunked; full on a CPU
            and for a model other than Llama, Qwen3, Qwen3-MoE).
    """
    run = ObjectiveRun.of(objective)
    run.check_held_out(eval_split=eval_split, eval_data_path=eval_data_path)
    tokenizer = resolve_tokenizer(data_path, tokenizer)  # prepared data names its own
    from transformers import AutoConfig, AutoModelForCausalLM

    if init_from is None and model_config is None:
        raise UsageError("pass --init-from HF_DIR (weights) or --model-config DIR_OR_FILE")
    resolve_paths = partial(
        FastPaths.resolve, attention=attention, compile_layers=compile_layers,
        fused_optimizer=fused_optimizer, cross_entropy=cross_entropy,
        device=run_device(accelerator),
        packed=run.objective.data is not DataKind.TEXT,  # post-training packs documents
    )  # fmt: skip
    resolve_paths()  # bad values are refused before anything is written
    if make_tiny_model and init_from is not None and not Path(init_from).exists():
        save_tiny_llama(init_from, seed)
    source = str(model_config or init_from)
    if not (Path(source) / "config.json").is_file() and not source.endswith(".json"):
        raise FileNotFoundError(
            f"{source} has no config.json: give a directory written by "
            "save_pretrained (or add --make-tiny-model to create a tiny Llama there)"
        )
    pretraining = run.objective.data is DataKind.TEXT
    if pretraining and not run.objective.native_cross_entropy:
        raise UsageError(
            f"--objective {run.name} reads pretraining text with a loss of its own; this "
            "recipe pretrains with the model's cross entropy only: use --objective pretrain"
        )
    schedule = resolve_schedule(
        run.objective, lr=lr, max_steps=max_steps, lr_schedule=lr_schedule,
        warmup_steps=warmup_steps, min_lr=min_lr,
    )  # fmt: skip
    config = AutoConfig.from_pretrained(source)
    paths = resolve_paths(model_config=config)
    loss_path = paths.cross_entropy  # how the loss reads the logits
    spec = None  # a spec family is recorded as baton's model spec; other models are not
    if config.model_type in FAMILIES:  # (HF weights of another shape: WeightsError on load)
        spec = ModelSpec.from_hf(source)
        check_init_from(init_from, spec)
    settings = {"tokenizer": tokenizer, "lr_schedule": schedule.decay}
    settings |= {"model_spec": spec.to_dict()} if spec else {}
    settings |= run.settings() | paths.settings() | loss_path.settings()
    keys = ["loss", "eval/loss", "lr", "throughput/tokens_per_s"]
    if pretraining:
        train, val, loss_fn, more_keys = pretraining_data(
            config, spec, data_path=data_path, tokenizer=tokenizer, seq_len=seq_len,
            batch_size=batch_size, seed=seed, text_key=text_key, eval_split=eval_split,
            eval_data_path=eval_data_path, cross_entropy=loss_path,
        )  # fmt: skip
        mean_over = None
    else:
        post = post_training(
            run, config, spec, data_path=data_path, tokenizer=tokenizer, init_from=init_from,
            batch_size=batch_size, seed=seed, accelerator=accelerator,
            eval_split=eval_split, eval_data_path=eval_data_path, cross_entropy=loss_path,
        )  # fmt: skip
        train, val, loss_fn, more_keys = post.train, post.val, post.loss_fn, post.console_keys
        mean_over = post.mean_over
        settings |= post.settings
    backend = FabricBackend(
        model=lambda: AutoModelForCausalLM.from_config(  # weights: --init-from
            # a copy: the reference model and the generator keep the config's attention
            copy.deepcopy(config),
            attn_implementation=paths.attn_implementation,
        ),
        optimizer=lambda model: torch.optim.AdamW(
            model.parameters(), lr=lr, weight_decay=0.0, **paths.optimizer_options()
        ),
        scheduler=lambda_scheduler(schedule),
        data=train,
        eval_data=val,
        loss_fn=loss_fn,
        mean_over=mean_over,
        fast_paths=paths,
        describe={"model": config.model_type, "hidden_size": config.hidden_size},
        config=FabricConfig(
            accelerator=accelerator,
            strategy=strategy,
            precision=precision,
            grad_accum=grad_accum,
            grad_clip=grad_clip or None,  # 0: no clipping
            seed=seed,
            init_from=init_from,
        ),
    )
    phase = None  # an objective on rollouts: sampled before each step from the weights
    if isinstance(train, RolloutRows) and not is_planning():
        assert data_path is not None and tokenizer is not None  # post_training checked
        phase = fabric_rollout_phase(
            run, backend, train, config, data_path=data_path, tokenizer=tokenizer,
            init_from=init_from, seq_len=seq_len, seed=seed, accelerator=accelerator,
        )  # fmt: skip
    callbacks = run_callbacks(
        keys + more_keys, save_every=save_every, progress=progress, rollouts=phase is not None
    )
    if eval_every is None:  # by default: evaluate whenever there is data to evaluate on
        eval_every = 50 if val is not None else 0
    return Driver(
        backend,
        callbacks,
        rollouts=phase,
        max_steps=max_steps,
        log_every=log_every,
        eval_every=0 if run.objective.rollouts else eval_every,  # nothing held out
        run_dir=run_dir,
        settings=settings,
        training_settings=run.objective.fixed_on_resume,
    )


def pretraining_data(
    config: Any,
    spec: ModelSpec | None,
    *,
    data_path: str | None,
    tokenizer: str | None,
    seq_len: int,
    batch_size: int,
    seed: int,
    text_key: str,
    eval_split: float,
    eval_data_path: str | None,
    cross_entropy: CrossEntropy = FULL,
) -> tuple[Any, Any, Any, list[str]]:
    """``(train, validation, loss_fn, console keys)`` of a pretraining run: byte windows,
    or with a tokenizer a prepared dataset or text files (a MoE adds its load-balancing
    loss and metrics), the loss on the ``cross_entropy`` path."""
    output_fn: Any = None  # byte batches are dicts: on the full path, the model's output
    if cross_entropy.path != "full":
        output_fn = partial(row_output, cross_entropy=cross_entropy)
    if tokenizer is None and (eval_split or eval_data_path is not None):
        raise UsageError(
            "--eval-split and --eval-data-path read tokenized data: pass --tokenizer DIR "
            "(byte runs evaluate on the tail of the text)"
        )
    if tokenizer is None:
        vocab = 256
        train, val = byte_lm_data(seq_len, batch_size, seed, data_path)
    elif data_path is None:
        raise ValueError("--tokenizer needs --data-path (a prepared dataset or text files)")
    else:
        train, val, vocab = text_loaders(
            data_path,
            tokenizer,
            seq_len=seq_len - 1,
            batch_size=batch_size,
            seed=seed,
            text_key=text_key,
            eval_split=eval_split,
            eval_data_path=eval_data_path,
        )
        output_fn = partial(window_output, cross_entropy=cross_entropy)
    if config.vocab_size < vocab:
        raise ValueError(
            f"the data's vocabulary has {vocab} tokens, the model's only {config.vocab_size}; "
            "use a model built for this tokenizer"
        )
    keys: list[str] = []
    loss_fn = None if output_fn is None else partial(output_loss, output_fn)
    if spec is not None and spec.moe is not None:
        config.output_router_logits = True  # transformers adds the load-balancing loss
        loss_fn = with_moe_metrics(
            output_fn,
            aux_loss_coef=spec.moe.aux_loss_coef,
            experts_per_token=spec.moe.experts_per_token,
        )
        keys += ["moe/aux_loss", "moe/load_balance"]
    return train, val, loss_fn, keys


def output_loss(output_fn: Any, model: Any, batch: Any) -> torch.Tensor:
    """The ``loss`` of ``output_fn(model, batch)``."""
    return output_fn(model, batch).loss
