"""TorchTitan's llama3 debug model (6.2 M parameters) trained on CPU through baton's loop.

uv run baton run recipes/torchtitan_llama3_debug.py --max-steps 20
uv run baton run recipes/torchtitan_llama3_debug.py --max-steps 40 --resume auto
uv run baton run recipes/torchtitan_llama3_debug.py --data-path corpus.jsonl --tokenizer tok/
uv run baton run recipes/torchtitan_llama3_debug.py --eval-split 0.05 --eval-every 10
uv run baton eval recipes/torchtitan_llama3_debug.py --eval-split 0.05 \
    --checkpoint runs/torchtitan_llama3_debug/checkpoints/latest
OMP_NUM_THREADS=1 uv run torchrun --nproc-per-node 4 -m baton.core.cli.command run \
    recipes/torchtitan_llama3_debug.py --dp-shard 2 --tp 2        # FSDP x TP on 4 ranks
OMP_NUM_THREADS=1 uv run torchrun --nproc-per-node 2 -m baton.core.cli.command run \
    recipes/torchtitan_llama3_debug.py --init-from qwen3-moe/ --ep 2  # experts on 2 ranks

Data: ``--data-path`` (``.jsonl``/``.parquet`` through TorchTitan's Hugging Face loader,
a ``baton data prepare`` prefix through ``PreparedDataLoader``, ``.txt`` through baton's
packed loader) with ``--tokenizer DIR`` (a local Hugging Face
tokenizer directory); without them, the Python language reference that ships with
CPython, byte-tokenized (no downloads). Layout: ``--dp-shard`` (FSDP, -1: every rank
the others leave), ``--tp``, ``--pp`` (with ``--pp-schedule``); a checkpoint saved on
another layout resumes through DCP's resharding (``--reshard-data restart`` when the
data-parallel degree changed: the data loader then starts over). ``--init-from CKPT``
starts from a checkpoint's weights only (step 0, fresh optimizer).

Model: TorchTitan's debug model (its vocabulary follows ``--tokenizer``), or any Llama,
Qwen3 or Qwen3-MoE ``config.json`` with ``--model-config DIR_OR_FILE`` (registered as a
flavour of TorchTitan's llama3 or qwen3 registry; a Qwen3-MoE with TorchTitan's MoE
layer, ``--ep`` its expert-parallel degree). ``--init-from HF_DIR`` (a ``save_pretrained`` directory)
trains that directory's architecture from its weights through TorchTitan's
``Llama3StateDictAdapter.from_hf``::

    uv run baton run recipes/torchtitan_llama3_debug.py --init-from tiny-llama/ --tokenizer tok/

Post-training: ``--objective`` any declared objective (``baton.core.objectives``; its
settings are flags: ``--objective sft`` trains on conversations, ``--objective dpo`` on
preference pairs with ``--dpo-beta``, ``--dpo-loss``, ``--reference``), on data prepared
by ``baton data prepare ... --seq-len N`` (pass the same ``--seq-len``). SFT is
TorchTitan's own cross entropy; every other objective is its declared loss as
TorchTitan's loss function (``torchtitan/objective_loss.py``)::

    uv run baton run recipes/torchtitan_llama3_debug.py --objective sft --data-path data/chat \
        --tokenizer tok/ --init-from tiny-llama/ --seq-len 96

Online RL: ``--objective grpo`` samples ``--num-generations`` completions of each prompt
(``baton data prepare PROMPTS.jsonl --tokenizer DIR --output PREFIX``) every step with a
``transformers`` model holding the policy's current weights (gathered from TorchTitan's
shards in memory), scores them with ``--reward`` functions and trains TRL's GRPO loss
inside ``Trainer.train_step``; ``--batch-size`` is rollouts per rank, and rows hold
``--seq-len`` >= ``--max-prompt-length`` + ``--max-completion-length`` tokens::

    uv run baton run recipes/torchtitan_llama3_debug.py --objective grpo --data-path data/prompts \
        --tokenizer tok/ --init-from sft-export/ --reward accuracy --num-generations 8 \
        --batch-size 16 --max-prompt-length 256 --max-completion-length 256 --seq-len 512

Their documents never attend to each other: TorchTitan's ``block_causal`` FlexAttention
on a GPU, SDPA under the same document mask on CPU (``torchtitan_cpu_attention``). Every
row trains unless ``--eval-split F`` (the last rows) or ``--eval-data-path PREFIX`` holds
some out; ``--eval-every N`` then evaluates the objective's loss over all of them.

Checkpoints: TorchTitan's DCP CheckpointManager under ``<run-dir>/checkpoints/step_NNNNNN``,
every ``--save-every`` steps and at the end.
"""

from __future__ import annotations

from typing import Any

from baton.backends.torchtitan import TorchTitanBackend
from baton.backends.torchtitan.configs import llama3_debug, set_evaluation, set_layout
from baton.backends.torchtitan.held_out import set_held_out
from baton.backends.torchtitan.hf import init_from_hf, set_vocab, tokenizer_vocab, use_spec
from baton.backends.torchtitan.lr_schedule import schedule_config
from baton.backends.torchtitan.objective import reads_text, reference_settings, use_objective
from baton.callbacks import RolloutRecords, standard_callbacks
from baton.callbacks.standard import CONSOLE_KEYS
from baton.core import Driver
from baton.core.errors import UsageError
from baton.core.lr_schedule import resolve_schedule
from baton.core.model.spec import check_init_from, is_hf_dir, resolve_spec
from baton.core.objectives import ObjectiveRun
from baton.data import resolve_tokenizer


def recipe(
    max_steps: int = 20,
    lr: float = 8e-4,
    lr_schedule: str | None = None,
    min_lr: float | None = None,
    warmup_steps: int = 0,
    batch_size: int = 4,
    seq_len: int = 128,
    seed: int = 0,
    log_every: int = 5,
    save_every: int = 10,
    async_save: bool = False,
    eval_every: int = 0,
    data_path: str | None = None,
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
    tokenizer: str | None = None,
    dp_shard: int = -1,
    tp: int = 1,
    pp: int = 1,
    pp_schedule: str = "1F1B",
    ep: int = 1,
    expert_bias: float | None = None,
    init_from: str | None = None,
    model_config: str | None = None,
    reshard_data: str = "refuse",
    objective: ObjectiveRun | str = "pretrain",
    run_dir: str = "runs/torchtitan_llama3_debug",
    progress: bool = True,
) -> Driver:
    """Train TorchTitan's llama3 debug model on CPU (or GPU) with TorchTitan's own train step.

    Args:
        max_steps: optimizer steps to train.
        lr: peak learning rate (after warmup).
        lr_schedule: after the warmup: constant, linear or cosine decay to --min-lr at
            --max-steps (default: the objective's, cosine for pretrain, constant for the
            post-training objectives).
        min_lr: the learning rate a decay ends at, at --max-steps (default: --lr / 10).
        warmup_steps: steps of linear warmup (0: none; at most --max-steps).
        batch_size: sequences per step and data-parallel rank.
        seq_len: tokens per sequence.
        seed: seed of the weights and of the data order.
        log_every: steps between log lines.
        save_every: steps between checkpoints (0: only when the run stops).
        async_save: write checkpoints in the background (TorchTitan's async mode;
            --set checkpoint.async_mode=async_with_pinned_mem for pinned memory).
        eval_every: steps between evaluations (0: none) with TorchTitan's validator
            (an objective on prepared rows: its loss over the held-out rows).
        data_path: .jsonl/.parquet, a prepared prefix or .txt (None: the Python reference).
        eval_split: the fraction of the data's documents (an objective on prepared rows:
            of its packed rows) held out for evaluation, the last ones (0: none; nothing is
            held out unless asked).
        eval_data_path: evaluation data, of the same kind as --data-path.
        tokenizer: a Hugging Face tokenizer directory (None: bytes).
        dp_shard: FSDP degree (-1: the ranks the other degrees leave).
        tp: tensor parallel degree.
        pp: pipeline parallel stages.
        pp_schedule: TorchTitan pipeline schedule: 1F1B, GPipe, Interleaved1F1B...
        ep: expert parallel degree of a Qwen3-MoE (experts sharded over dp_shard x tp).
        expert_bias: balance a Qwen3-MoE's experts with TorchTitan's expert bias, this
            update rate (its own flavours use 1e-3); such a run does not export to HF.
        init_from: a checkpoint or Hugging Face directory whose weights start the run.
        model_config: a Hugging Face Llama, Qwen3 or Qwen3-MoE config.json (or its
            directory) to build.
        reshard_data: when the data-parallel degree changed on resume: refuse or restart.
        objective: what a step minimises (its settings are flags of their own).
        run_dir: where checkpoints and logs go.
        progress: show the progress bar.
    """
    run = ObjectiveRun.of(objective)
    run.check_held_out(eval_split=eval_split, eval_data_path=eval_data_path)
    tokenizer = resolve_tokenizer(data_path, tokenizer)  # prepared data names its own
    schedule = resolve_schedule(
        run.objective, lr=lr, max_steps=max_steps, lr_schedule=lr_schedule,
        warmup_steps=warmup_steps, min_lr=min_lr,
    )  # fmt: skip
    config = llama3_debug(
        steps=max_steps,
        seq_len=seq_len,
        local_batch_size=batch_size,
        seed=seed,
        dump_folder=f"{run_dir}/torchtitan",
        dataset_path=data_path if reads_text(run) else None,  # else packed rows
        tokenizer=tokenizer,
        log_freq=log_every,
    )
    held_out = bool(eval_split or eval_data_path is not None)
    if held_out and reads_text(run):  # TorchTitan's validator, on local data
        set_evaluation(
            config, data_path=data_path, eval_split=eval_split, eval_data_path=eval_data_path
        )
    elif eval_every and not held_out:
        raise UsageError(
            f"--eval-every {eval_every} needs held-out data: pass --eval-split F (the last "
            "documents of --data-path) or --eval-data-path FILE_OR_PREFIX"
        )
    set_layout(config, dp_shard=dp_shard, tp=tp, pp=pp, pp_schedule=pp_schedule, ep=ep)
    spec = resolve_spec(model_config, init_from)
    check_init_from(init_from, spec)
    if spec is not None:
        use_spec(config, spec)
    elif tokenizer is not None:  # the debug model's vocabulary follows the tokenizer
        set_vocab(config, tokenizer_vocab(tokenizer))
    use_objective(config, run, data_path)
    if held_out and not reads_text(run):  # the last rows, or other prepared data
        set_held_out(config, run, eval_split=eval_split, eval_data_path=eval_data_path)
    reference = reference_settings(run, init_from=init_from, spec=spec, data_path=data_path)
    if init_from is not None and is_hf_dir(init_from):
        init_from_hf(config, init_from)
    elif init_from is not None:  # weights only, through TorchTitan's initial load path
        config.checkpoint.initial_load_path = init_from
    if expert_bias is not None and run.objective.rollouts:
        raise UsageError(
            f"--objective {run.name} loads the policy's weights into a Hugging Face model "
            "each step, which has no place for an expert bias; train without --expert-bias"
        )
    if expert_bias is not None:  # TorchTitan's auxiliary-loss-free balancing
        from baton.backends.torchtitan.moe import use_expert_bias

        use_expert_bias(config, expert_bias)
    for group in config.optimizer.param_groups:
        group.optimizer_kwargs["lr"] = lr
    config.lr_scheduler = schedule_config(schedule)
    config.checkpoint.async_mode = "async" if async_save else "disabled"
    # a resume with other reference weights is refused (reference_fingerprint)
    settings: dict[str, Any] = {"tokenizer": tokenizer, "lr_schedule": schedule.decay}
    settings |= run.settings() | reference
    if spec is not None:
        settings["model_spec"] = spec.to_dict()
    backend = TorchTitanBackend(config, reshard_data=reshard_data)
    callbacks = standard_callbacks(
        save_every=save_every,
        async_save=async_save,
        progress=progress,
        console_keys=(*CONSOLE_KEYS, *run.objective.console_keys),
    )
    rollouts = None
    if run.objective.rollouts:  # each step's rollouts, sampled with the current weights
        from baton.backends.torchtitan.online_rl import titan_rollout_phase

        rollouts = titan_rollout_phase(
            run, backend, data_path=data_path, tokenizer=tokenizer, init_from=init_from,
            spec=spec, seed=seed,
        )  # fmt: skip
        callbacks.append(RolloutRecords())
    return Driver(
        backend,
        callbacks,
        rollouts=rollouts,
        max_steps=max_steps,
        log_every=log_every,
        eval_every=eval_every or None,
        run_dir=run_dir,
        settings=settings,
        training_settings=run.objective.fixed_on_resume,
    )
