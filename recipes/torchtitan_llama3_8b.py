"""Llama 3 8B with TorchTitan on 8 GPUs (FSDP, TP, PP, bf16, optional torch.compile) through baton.

torchrun --nproc-per-node 8 -m baton.core.cli.command run recipes/torchtitan_llama3_8b.py \\
    --data-path corpus.jsonl --tokenizer ./assets/hf/Llama-3.1-8B --compile
uv run baton run recipes/torchtitan_llama3_8b.py --dry-run             # on CPU: plan only
uv run baton run recipes/torchtitan_llama3_8b.py --dry-run --tp 2 --pp 2 --world-size 16
torchrun --nproc-per-node 8 -m baton.core.cli.command run recipes/torchtitan_llama3_8b.py \\
    --objective sft --data-path data/chat --tokenizer ./assets/hf/Llama-3.1-8B \\
    --init-from ./assets/hf/Llama-3.1-8B --seq-len 4096     # fine-tune on prepared chats
torchrun --nproc-per-node 8 -m baton.core.cli.command run recipes/torchtitan_llama3_8b.py \\
    --objective grpo --data-path data/prompts --tokenizer sft-export/ --init-from sft-export/ \\
    --reward accuracy --num-generations 8 --batch-size 2 --seq-len 1024   # online RL (GRPO)

The config is TorchTitan's own ``llama3_8b()``, its learning rate on baton's one schedule
(``baton.core.lr_schedule``, TorchTitan's ``LRSchedulersContainer`` built from it) as on
every LLM recipe: ``--lr-schedule`` (default: the objective's, cosine for pretraining,
constant for ``sft``, ``dpo`` and ``grpo``), ``--warmup-steps`` (default 0) and
``--min-lr`` (default ``--lr`` / 10), the decay ending at ``--max-steps``. Data comes from a local ``.jsonl`` /
``.parquet`` file through TorchTitan's Hugging Face text loader and the tokenizer from a
local Hugging Face directory (``tokenizer.json``; the Llama 3.1 one for real runs).
``--dry-run`` needs neither: it checks the layout (``--dp-shard`` x ``--tp`` x ``--pp``,
``--dp-replicate``) against ``--world-size`` ranks (default 8), builds the model on the
meta device and prints the plan, without training (the backend's ``dry_run``).

Model: Llama 3 8B, or any Llama, Qwen3 or Qwen3-MoE ``config.json`` with
``--model-config DIR_OR_FILE`` (Llama 3.1's ``rope_scaling`` included; a Qwen3-MoE
such as Qwen3-30B-A3B with TorchTitan's MoE layer, ``--ep`` its expert-parallel degree:
``--dry-run --model-config Qwen3-30B-A3B/ --ep 8 --world-size 64`` plans it); ``--init-from HF_DIR`` (a ``save_pretrained``
directory, e.g. Llama-3.1-8B) trains that directory's architecture from its weights
through TorchTitan's ``Llama3StateDictAdapter.from_hf`` (a baton checkpoint: its weights)::

    torchrun --nproc-per-node 8 -m baton.core.cli.command run recipes/torchtitan_llama3_8b.py \\
        --init-from ./assets/hf/Llama-3.1-8B --tokenizer ./assets/hf/Llama-3.1-8B \\
        --data-path corpus.jsonl

Online RL (``--objective grpo`` on prompts from ``baton data prepare PROMPTS.jsonl``): rank 0
samples each step's completions with a ``transformers`` model on its GPU holding the
policy's current weights (gathered whole from TorchTitan's shards in memory), every rank
trains its share of them inside ``Trainer.train_step``; ``--batch-size`` is rollouts per
data-parallel rank, ``--seq-len`` at least ``--max-prompt-length`` +
``--max-completion-length``.
"""

from __future__ import annotations

from typing import Any

from baton.backends.torchtitan import TorchTitanBackend
from baton.callbacks import RolloutRecords, standard_callbacks
from baton.callbacks.standard import CONSOLE_KEYS
from baton.core import Driver
from baton.core.cli.dry_run import is_planning, require_data
from baton.core.cli.recipe import RecipeError
from baton.core.lr_schedule import resolve_schedule
from baton.core.model.spec import check_init_from, is_hf_dir, resolve_spec
from baton.core.objectives import ObjectiveRun
from baton.data import resolve_tokenizer


def recipe(
    data_path: str | None = None,
    tokenizer: str | None = None,
    max_steps: int = 1000,
    dp_replicate: int = 1,
    dp_shard: int = -1,
    tp: int = 1,
    pp: int = 1,
    pp_schedule: str = "1F1B",
    ep: int = 1,
    batch_size: int = 1,
    seq_len: int = 8192,
    lr: float = 3e-4,
    lr_schedule: str | None = None,
    min_lr: float | None = None,
    warmup_steps: int = 0,
    compile: bool = False,
    async_save: bool = True,
    log_every: int = 10,
    run_dir: str = "runs/torchtitan_llama3_8b",
    init_from: str | None = None,
    model_config: str | None = None,
    objective: ObjectiveRun | str = "pretrain",
) -> Driver:
    """Llama 3 8B pre-training; ``dp_shard=-1`` gives FSDP every rank TP and PP leave.

    Args:
        data_path: a local .jsonl or .parquet file with a "text" key (required to train).
        tokenizer: a Hugging Face tokenizer directory (required to train).
        max_steps: optimizer steps to train (the schedule spans them).
        dp_replicate: replicated data-parallel degree (HSDP).
        dp_shard: FSDP degree (-1: the ranks the other degrees leave).
        tp: tensor parallel degree.
        pp: pipeline parallel stages.
        pp_schedule: TorchTitan pipeline schedule: 1F1B, GPipe, Interleaved1F1B...
        ep: expert parallel degree of a Qwen3-MoE (experts sharded over dp_shard x tp).
        batch_size: sequences per step and data-parallel rank.
        seq_len: tokens per sequence.
        lr: peak learning rate (after warmup).
        lr_schedule: after the warmup: constant, linear or cosine decay to --min-lr at
            --max-steps (default: the objective's, cosine for pretrain, constant for the
            post-training objectives).
        min_lr: the learning rate a decay ends at, at --max-steps (default: --lr / 10).
        warmup_steps: steps of linear warmup (0: none; at most --max-steps).
        compile: compile the model with torch.compile.
        async_save: write checkpoints in the background (TorchTitan's async mode;
            --set checkpoint.async_mode=async_with_pinned_mem for pinned memory).
        log_every: steps between log lines.
        run_dir: where checkpoints and logs go.
        init_from: a checkpoint or Hugging Face directory whose weights start the run.
        model_config: a Hugging Face Llama, Qwen3 or Qwen3-MoE config.json (or its
            directory) to build.
        objective: what a step minimises (its settings are flags of their own).
    """
    from torchtitan.models.llama3.config_registry import llama3_8b

    from baton.backends.torchtitan.configs import dataloader_config, set_layout, tokenizer_config
    from baton.backends.torchtitan.hf import init_from_hf, use_spec
    from baton.backends.torchtitan.lr_schedule import schedule_config
    from baton.backends.torchtitan.objective import (
        reads_text,
        reference_settings,
        use_objective,
    )

    run = ObjectiveRun.of(objective)
    tokenizer = resolve_tokenizer(data_path, tokenizer)  # prepared data names its own
    schedule = resolve_schedule(
        run.objective, lr=lr, max_steps=max_steps, lr_schedule=lr_schedule,
        warmup_steps=warmup_steps, min_lr=min_lr,
    )  # fmt: skip
    require_data(
        "a local .jsonl or .parquet file with a 'text' key, and a Hugging Face tokenizer "
        "directory such as Llama 3.1's",
        data_path=data_path,
        tokenizer=tokenizer,
    )
    config = llama3_8b()
    spec = resolve_spec(model_config, init_from)
    check_init_from(init_from, spec)
    if spec is not None:
        use_spec(config, spec)
    if init_from is not None and is_hf_dir(init_from):
        init_from_hf(config, init_from)
    elif init_from is not None:  # weights only, through TorchTitan's initial load path
        config.checkpoint.initial_load_path = init_from
    config.dump_folder = f"{run_dir}/torchtitan"
    config.training.steps = max_steps
    config.training.local_batch_size = batch_size
    config.training.seq_len = seq_len
    config.training.mixed_precision_param = "bfloat16"
    set_layout(
        config,
        dp_replicate=dp_replicate,
        dp_shard=dp_shard,
        tp=tp,
        pp=pp,
        pp_schedule=pp_schedule,
        ep=ep,
    )
    for group in config.optimizer.param_groups:
        group.optimizer_kwargs["lr"] = lr
    config.lr_scheduler = schedule_config(schedule)
    config.compile.enable = compile
    config.checkpoint.async_mode = "async" if async_save else "disabled"
    config.metrics.log_freq = log_every
    if data_path is not None and tokenizer is not None:  # (a dry run plans without them)
        try:
            config.tokenizer, config.hf_assets_path = tokenizer_config(tokenizer)
            if reads_text(run):
                config.dataloader = dataloader_config(data_path)
        except (OSError, ValueError) as error:
            raise RecipeError(str(error)) from None
        use_objective(config, run, data_path)
    # a resume with other reference weights is refused (reference_fingerprint)
    reference = reference_settings(run, init_from=init_from, spec=spec, data_path=data_path)
    settings: dict[str, Any] = {"tokenizer": tokenizer, "lr_schedule": schedule.decay}
    settings |= run.settings() | reference
    if spec is not None:
        settings["model_spec"] = spec.to_dict()
    backend = TorchTitanBackend(config)
    callbacks = standard_callbacks(
        async_save=async_save, console_keys=(*CONSOLE_KEYS, *run.objective.console_keys)
    )
    rollouts = None
    if run.objective.rollouts and not is_planning():  # a dry run samples nothing
        from baton.backends.torchtitan.online_rl import titan_rollout_phase

        rollouts = titan_rollout_phase(
            run, backend, data_path=data_path, tokenizer=tokenizer, init_from=init_from,
            spec=spec, seed=int(config.debug.seed or 0),
        )  # fmt: skip
        callbacks.append(RolloutRecords())
    return Driver(
        backend,
        callbacks,
        rollouts=rollouts,
        max_steps=max_steps,
        log_every=log_every,
        run_dir=run_dir,
        settings=settings,
        training_settings=run.objective.fixed_on_resume,
    )
