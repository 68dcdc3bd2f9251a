"""A tiny Megatron-Core GPTModel on real text, on CPU.

uv run baton run recipes/megatron_gpt_tiny.py --max-steps 50
uv run baton run recipes/megatron_gpt_tiny.py --max-steps 100 --resume auto
uv run baton data tokenizer runs/tok && uv run baton data prepare corpus.jsonl \\
    --tokenizer runs/tok --output data/corpus
uv run baton run recipes/megatron_gpt_tiny.py --data-path data/corpus --tokenizer runs/tok
uv run baton run recipes/megatron_gpt_tiny.py --llama       # Llama-style blocks (RMSNorm, SwiGLU, RoPE)
uv run baton run recipes/megatron_gpt_tiny.py --model-config tiny-llama/   # any Llama config.json
uv run baton run recipes/megatron_gpt_tiny.py --init-from tiny-llama/      # + its HF weights
uv run baton run recipes/megatron_gpt_tiny.py --init-from tiny-qwen3-moe/  # Megatron's MoE layers
uv run baton run recipes/megatron_gpt_tiny.py --objective sft --init-from tiny-llama/ \\
    --data-path data/chat --tokenizer runs/tok --seq-len 512   # conversations, packed
    ... --objective dpo --data-path data/pairs --dpo-beta 0.1  # preference pairs
    ... --objective grpo --data-path data/prompts --reward rewards.py:fn \
    --num-generations 8 --global-batch-size 16 --seq-len 1024   # online RL on rollouts
    ... --capacity-factor 1.0                          # the router drops what overflows
OMP_NUM_THREADS=1 uv run torchrun --nproc-per-node 2 -m baton.core.cli.command run \\
    recipes/megatron_gpt_tiny.py --max-steps 50        # data parallel 2 on gloo
    ... --pp 2                                         # 1F1B over 2 stages
    ... --pp 2 --vpp 2 --layers 4                      # interleaved
    ... --tp 2 --distributed-optimizer
    ... --init-from tiny-qwen3-moe/ --ep 2             # expert parallel: 2 experts a rank

Megatron's own path end to end: a prepared dataset (or a blend "0.7 A 0.3 B") read with
the Hugging Face tokenizer through megatron.core.tokenizers, or without them the bytes of
the Python language reference written as an indexed dataset; GPTDataset, GPTModel in
Megatron's DDP, Megatron's optimizer and LR schedule, its forward-backward schedules, and
dist_checkpointing saves (asynchronous). A checkpoint resumes under another tensor or
pipeline layout (without the distributed optimizer), resharded on load.
"""

from __future__ import annotations

from baton.backends.megatron import MegatronBackend, MegatronConfig
from baton.backends.megatron.config import tiny_transformer_config
from baton.backends.megatron.evaluation import held_out_split
from baton.backends.megatron.hf import transformer_fields, use_spec
from baton.backends.megatron.moe import moe_layout
from baton.backends.megatron.rollout_phase import megatron_rollout_phase
from baton.backends.rollouts.policy import policy_spec
from baton.callbacks import CONSOLE_KEYS, RolloutRecords, standard_callbacks
from baton.core import Driver
from baton.core.cli.dry_run import is_planning
from baton.core.errors import UsageError
from baton.core.lr_schedule import resolve_schedule
from baton.core.model.spec import check_init_from, resolve_spec
from baton.core.objectives import ObjectiveRun
from baton.data import resolve_tokenizer


def recipe(
    max_steps: int = 50,
    lr: float = 3e-3,
    lr_schedule: str | None = None,
    min_lr: float | None = None,
    warmup_steps: int = 0,
    layers: int = 2,
    d_model: int = 64,
    heads: int = 4,
    seq_len: int = 64,
    batch_size: int = 4,
    global_batch_size: int = 8,
    llama: bool = False,
    tp: int = 1,
    pp: int = 1,
    vpp: int = 1,
    ep: int = 1,
    capacity_factor: float | None = None,
    sequence_parallel: bool = False,
    distributed_optimizer: bool = False,
    seed: int = 1234,
    log_every: int = 10,
    eval_every: int | None = None,
    save_every: int = 25,
    async_save: bool = True,
    data_path: str | None = None,
    eval_split: float | None = None,
    eval_data_path: str | None = None,
    tokenizer: str | None = None,
    init_from: str | None = None,
    model_config: str | None = None,
    objective: ObjectiveRun | str = "pretrain",
    run_dir: str = "runs/megatron_gpt_tiny",
    progress: bool = True,
) -> Driver:
    """Train a tiny Megatron-Core GPT on prepared data (``--data-path`` prefix or blend with
    its ``--tokenizer``) or, without them, on bytes of the Python language reference.

    ``--llama`` builds Llama-style blocks instead of GPT's: RMSNorm, a SwiGLU MLP of width
    ``8/3 x hidden`` rounded up to a multiple of 256 (as Llama 3), no biases, rotary
    positions, an untied output layer. ``--model-config`` (a Hugging Face Llama
    ``config.json`` or its directory) builds that architecture instead, and
    ``--init-from HF_DIR`` that directory's architecture with its weights.

    Args:
        max_steps: optimizer steps to train (the schedule spans them).
        lr: peak learning rate (after warmup).
        lr_schedule: after the warmup: constant, linear or cosine decay to --min-lr at
            --max-steps (default: the objective's, cosine for pretrain, constant for the
            post-training objectives).
        min_lr: the learning rate a decay ends at, at --max-steps (default: --lr / 10).
        warmup_steps: steps of linear warmup (0: none; at most --max-steps).
        layers: transformer layers.
        d_model: model width (Megatron's hidden size).
        heads: attention heads.
        seq_len: tokens per sequence.
        batch_size: sequences per forward pass and data-parallel rank (the micro batch;
            rollouts for an objective that samples them).
        global_batch_size: sequences per optimizer step over all ranks (the rollouts
            sampled per step: --num-generations must divide it).
        llama: Llama-style blocks (RMSNorm, SwiGLU, RoPE, untied output layer).
        tp: tensor parallel degree.
        pp: pipeline parallel stages.
        vpp: model chunks per pipeline stage (above 1: interleaved 1F1B).
        ep: expert parallel degree (a mixture-of-experts --model-config: each rank holds
            num_experts / ep experts).
        capacity_factor: tokens an expert takes, as a multiple of its even share; the
            router drops the rest (mixture-of-experts; default: dropless).
        sequence_parallel: Megatron's sequence parallelism (with --tp).
        distributed_optimizer: shard optimizer state over data-parallel ranks.
        seed: seed of the weights and of the data order.
        log_every: steps between log lines.
        eval_every: steps between evaluations (0: none; None: 25 where there is
            evaluation data, else none).
        save_every: steps between checkpoints (0: only when the run stops).
        async_save: write checkpoints in the background.
        data_path: a UTF-8 text file to train on as bytes (None: the Python reference),
            or with --tokenizer a prepared prefix or blend "0.7 A 0.3 B" (prepared
            prompts for an objective that samples completions).
        eval_split: the fraction of the documents (an objective on prepared rows: of its
            packed rows) held out for evaluation, the last ones (0: none); None: none
            held out of prepared data (nothing is held out unless asked), Megatron's
            split 969,30,1 for bytes.
        eval_data_path: an objective on prepared rows: other prepared data of the same
            kind to evaluate on.
        tokenizer: the Hugging Face tokenizer directory --data-path was prepared with.
        init_from: a baton checkpoint or Hugging Face directory whose weights start the run.
        model_config: a Hugging Face Llama, Qwen3 or Qwen3-MoE config.json (or its
            directory) to build.
        objective: what a step minimises, with its settings (their flags come from the
            objective's declaration): pretrain, an objective on rows packed by
            `baton data prepare --seq-len` (sft, dpo, ...), or one on completions it
            samples from prepared prompts each step (grpo; --seq-len must hold the
            longest prompt and completion).
        run_dir: where checkpoints, logs and the byte dataset go.
        progress: show the progress bar.
    """
    run = ObjectiveRun.of(objective)
    run.check_held_out(eval_split=eval_split or 0.0, eval_data_path=eval_data_path)
    tokenizer = resolve_tokenizer(data_path, tokenizer)  # prepared data names its own
    schedule = resolve_schedule(
        run.objective, lr=lr, max_steps=max_steps, lr_schedule=lr_schedule,
        warmup_steps=warmup_steps, min_lr=min_lr,
    )  # fmt: skip
    import torch
    import torch.nn.functional as F

    block = (
        dict(
            normalization="RMSNorm",
            gated_linear_unit=True,
            activation_func=F.silu,
            add_bias_linear=False,
            ffn_hidden_size=-(-8 * d_model // 3 // 256) * 256,
        )
        if llama
        else dict(ffn_hidden_size=4 * d_model)
    )

    spec = resolve_spec(model_config, init_from)
    if run.objective.rollouts and not is_planning():  # the generator's architecture
        spec = policy_spec(spec, init_from, run)
    check_init_from(init_from, spec)
    shape: dict[str, object] = dict(
        num_layers=layers, hidden_size=d_model, num_attention_heads=heads
    )
    if spec is not None:
        shape, block = transformer_fields(spec), {}
    config = MegatronConfig(
        model=tiny_transformer_config(
            **shape,
            **block,
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            sequence_parallel=sequence_parallel,
            pipeline_dtype=torch.float32 if pp > 1 else None,
            **moe_layout(spec, ep=ep, capacity_factor=capacity_factor),
        ),
        seq_len=seq_len,
        micro_batch_size=batch_size,
        global_batch_size=global_batch_size,
        warmup_steps=schedule.warmup_steps,
        decay_steps=schedule.total_steps,
        decay_style=schedule.decay,  # pyright: ignore[reportArgumentType]
        position_embedding_type="rope" if llama else "learned_absolute",
        share_embeddings_and_output_weights=not llama,
        seed=seed,
    )
    if spec is not None:
        use_spec(config, spec)
    config.optimizer.lr = schedule.peak
    config.optimizer.min_lr = schedule.floor
    config.ddp.use_distributed_optimizer = distributed_optimizer
    config.init_from = init_from  # a checkpoint's weights, fresh optimizer (fine-tuning)
    config.objective = run
    prepared = tokenizer is not None  # else --data-path is a text file of bytes
    config.data.text_path = None if prepared else data_path
    config.data.data_path = data_path if prepared else None
    config.data.tokenizer = tokenizer
    config.data.train_samples = max_steps * global_batch_size if prepared else None
    config.data.cache_dir = f"{run_dir}/data"
    if config.packed_rows:  # held-out packed rows: the last ones, or other data
        config.data.eval_split = eval_split or 0.0
        config.data.eval_data_path = eval_data_path
        has_eval_data = bool(eval_split or eval_data_path is not None)
    elif eval_data_path is not None:
        raise UsageError(
            "--eval-data-path is evaluation data for an objective on packed rows on "
            "Megatron-Core; a pretraining run holds the last documents out with --eval-split F"
        )
    elif prepared:  # Megatron's validation split: the last documents, none unless asked
        config.data.split = held_out_split(eval_split or 0.0)
        has_eval_data = bool(eval_split)
    else:  # the byte corpus: Megatron's split unless --eval-split says otherwise
        config.data.split = None if eval_split is None else held_out_split(eval_split)
        has_eval_data = eval_split is None or eval_split > 0
    if eval_every is None:  # by default: evaluate whenever there is data to evaluate on
        eval_every = 25 if has_eval_data else 0
    backend = MegatronBackend(config)
    phase = None  # an objective on rollouts: sampled before each step from the weights
    if run.objective.rollouts and not is_planning():
        phase = megatron_rollout_phase(backend, init_from=init_from)
    return Driver(
        backend,
        standard_callbacks(
            save_every=save_every,
            async_save=async_save,
            progress=progress,
            console_keys=(*CONSOLE_KEYS, *run.objective.console_keys),
            extra=(RolloutRecords(),) if phase is not None else (),
        ),
        rollouts=phase,
        max_steps=max_steps,
        log_every=log_every,
        eval_every=eval_every,
        run_dir=run_dir,
        settings={"tokenizer": tokenizer, "lr_schedule": schedule.decay, **run.settings()}
        | ({"model_spec": spec.to_dict()} if spec else {}),
        training_settings=run.objective.fixed_on_resume,
    )
