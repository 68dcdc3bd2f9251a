"""Llama 3 8B on Megatron-Core: the real GPU configuration, launched with torchrun.

    torchrun --nnodes 2 --nproc-per-node 8 ... -m baton.core.cli.command run \\
        recipes/megatron_llama3_8b.py --tp 2 --pp 1 \\
        --data-path "0.7 data/web 0.3 data/code" --tokenizer tokenizers/llama3
    uv run baton run recipes/megatron_llama3_8b.py --dry-run --world-size 16   # on CPU
    uv run baton run recipes/megatron_llama3_8b.py --dry-run --world-size 16 \\
        --pp 4 --vpp 2      # interleaved 1F1B, validated

bf16, the distributed optimizer, Transformer Engine layers when installed (local layers
otherwise), RoPE, RMSNorm, SwiGLU, grouped-query attention. The learning rate follows
baton's one schedule (``baton.core.lr_schedule``, Megatron-Core's
``OptimizerParamScheduler`` built from it), as on every LLM recipe: ``--lr-schedule``
(default: the objective's, cosine for pretraining, constant for ``sft``, ``dpo`` and
``grpo``), ``--warmup-steps`` (default 0) and ``--min-lr`` (default ``--lr`` / 10), the
decay ending at ``--max-steps``; a warmup is asked for by name, e.g. ``--warmup-steps
2000``. ``--dry-run`` builds and
validates the Megatron configuration objects and prints the parallel layout for
``--world-size`` ranks without initialising a process group or training (the backend's
``dry_run``).

Data: prepared datasets (``baton data prepare``; a prefix or a blend such as
``"0.7 data/web 0.3 data/code"``) read with the Llama 3 tokenizer directory they were
prepared with, through Megatron's GPTDataset. Without ``--data-path`` and ``--tokenizer``
the recipe refuses to start. The model keeps Llama 3's 128256-row vocabulary.
``--objective sft`` / ``dpo`` fine-tune on conversations or preference pairs packed by
``baton data prepare --seq-len N`` (pass ``--seq-len N`` and ``--init-from`` the model);
``--objective grpo`` trains on completions it samples each step from prepared prompts
(``--global-batch-size`` rollouts a step, rows of ``--seq-len`` >= the longest prompt and
completion; ``--init-from`` the model's Hugging Face directory, a ``transformers``
generator on global rank 0 sampling with the weights it trains).

Model: Llama 3 8B, or any Llama ``config.json`` with ``--model-config DIR_OR_FILE`` (built
through ``TransformerConfig``; Llama 3.x ``rope_scaling`` as Megatron's ``rope_scaling``);
``--init-from HF_DIR`` (a ``save_pretrained`` directory, e.g. Llama-3.1-8B) trains that
directory's architecture from its weights (a baton checkpoint: its weights), step 0::

    torchrun --nproc-per-node 8 -m baton.core.cli.command run recipes/megatron_llama3_8b.py \\
        --init-from hf/Llama-3.1-8B --data-path data/web --tokenizer hf/Llama-3.1-8B

A Qwen3 or Qwen3-MoE ``config.json`` builds that model; ``--ep`` spreads a MoE model's
experts over expert-parallel ranks (Megatron's MoE layers)::

    uv run baton run recipes/megatron_llama3_8b.py --dry-run --world-size 64 \\
        --model-config hf/Qwen3-30B-A3B --tp 1 --pp 2 --ep 8
"""

from __future__ import annotations

from baton.backends.megatron import MegatronBackend, MegatronConfig
from baton.backends.megatron.rollout_phase import megatron_rollout_phase
from baton.backends.rollouts.policy import policy_spec
from baton.callbacks import CONSOLE_KEYS, RolloutRecords, standard_callbacks
from baton.core import Driver
from baton.core.cli.dry_run import is_planning, require_data
from baton.core.lr_schedule import LRSchedule, resolve_schedule
from baton.core.model.spec import LlamaSpec, check_init_from, resolve_spec
from baton.core.objectives import ObjectiveRun
from baton.data import resolve_tokenizer


def llama3_8b_config(
    tensor_parallel: int,
    pipeline_parallel: int,
    virtual_pipeline: int,
    seq_len: int,
    micro_batch_size: int,
    global_batch_size: int,
    schedule: LRSchedule,
    spec: LlamaSpec | None = None,
    expert_parallel: int = 1,
) -> MegatronConfig:
    """The 8B run's Megatron configuration, its learning rate on ``schedule`` (a recipe's
    ``resolve_schedule``); ``spec``: that architecture instead of 8B's."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    from baton.backends.megatron.hf import transformer_fields, use_spec
    from baton.backends.megatron.moe import moe_layout

    architecture = dict(
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,
        num_attention_heads=32,
        num_query_groups=8,
        kv_channels=128,
        normalization="RMSNorm",
        layernorm_epsilon=1e-5,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
    )
    if spec is not None:
        architecture = transformer_fields(spec)
    model = TransformerConfig(
        **architecture,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        virtual_pipeline_model_parallel_size=virtual_pipeline if virtual_pipeline > 1 else None,
        sequence_parallel=tensor_parallel > 1,
        use_cpu_initialization=False,
        **moe_layout(spec, ep=expert_parallel, capacity_factor=None),
    )
    config = MegatronConfig(
        model=model,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        global_batch_size=global_batch_size,
        vocab_size=128256,
        make_vocab_size_divisible_by=128,
        layer_spec="auto",
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
        rotary_base=500000.0,
        warmup_steps=schedule.warmup_steps,
        decay_steps=schedule.total_steps,
        decay_style=schedule.decay,  # pyright: ignore[reportArgumentType]
    )
    if spec is not None:
        use_spec(config, spec)
    config.optimizer.lr, config.optimizer.min_lr = schedule.peak, schedule.floor
    config.optimizer.bf16 = True
    config.optimizer.params_dtype = torch.bfloat16
    config.ddp.use_distributed_optimizer = True
    config.ddp.grad_reduce_in_fp32 = True
    config.ddp.overlap_grad_reduce = True
    config.ddp.overlap_param_gather = True
    return config


def recipe(
    max_steps: int = 1000,
    tp: int = 2,
    pp: int = 1,
    vpp: int = 1,
    ep: int = 1,
    seq_len: int = 8192,
    batch_size: int = 1,
    global_batch_size: int = 128,
    lr: float = 3e-4,
    lr_schedule: str | None = None,
    min_lr: float | None = None,
    warmup_steps: int = 0,
    data_path: str | None = None,
    tokenizer: str | None = None,
    save_every: int = 500,
    run_dir: str = "runs/megatron_llama3_8b",
    init_from: str | None = None,
    model_config: str | None = None,
    objective: ObjectiveRun | str = "pretrain",
) -> Driver:
    """Llama 3 8B pretraining on Megatron-Core (``--dry-run`` validates and prints the layout).

    Args:
        max_steps: optimizer steps to train (the schedule spans them).
        tp: tensor parallel degree (above 1: sequence parallel too).
        pp: pipeline parallel stages.
        vpp: model chunks per pipeline stage (above 1: interleaved 1F1B).
        ep: expert parallel degree (a mixture-of-experts --model-config, e.g. Qwen3-30B-A3B).
        seq_len: tokens per sequence.
        batch_size: sequences per forward pass and data-parallel rank (the micro batch;
            rollouts for an objective that samples them).
        global_batch_size: sequences per optimizer step over all ranks (the rollouts
            sampled per step: --num-generations must divide it).
        lr: peak learning rate (after warmup).
        lr_schedule: after the warmup: constant, linear or cosine decay to --min-lr at
            --max-steps (default: the objective's, cosine for pretrain, constant for the
            post-training objectives).
        min_lr: the learning rate a decay ends at, at --max-steps (default: --lr / 10).
        warmup_steps: steps of linear warmup (0: none; at most --max-steps).
        data_path: a prepared prefix or blend "0.7 A 0.3 B" (required to train; prepared
            prompts for an objective that samples completions).
        tokenizer: the Llama 3 tokenizer directory the data was prepared with.
        save_every: steps between checkpoints (0: only when the run stops).
        run_dir: where checkpoints, logs and the dataset index cache go.
        init_from: a baton checkpoint or Hugging Face directory whose weights start the run.
        model_config: a Hugging Face config.json (Llama, Qwen3, Qwen3-MoE) or its directory.
        objective: what a step minimises, with its settings (their flags come from the
            objective's declaration): pretrain, an objective on rows packed by
            `baton data prepare --seq-len` (sft, dpo, ...), or one on completions it
            samples from prepared prompts each step (grpo).
    """
    run = ObjectiveRun.of(objective)
    tokenizer = resolve_tokenizer(data_path, tokenizer)  # prepared data names its own
    schedule = resolve_schedule(
        run.objective, lr=lr, max_steps=max_steps, lr_schedule=lr_schedule,
        warmup_steps=warmup_steps, min_lr=min_lr,
    )  # fmt: skip
    require_data(
        "a prepared prefix or blend '0.7 PREFIX_A 0.3 PREFIX_B' from `baton data prepare` "
        "and the Llama 3 tokenizer directory it was prepared with",
        data_path=data_path,
        tokenizer=tokenizer,
    )
    spec = resolve_spec(model_config, init_from)
    if run.objective.rollouts and not is_planning():  # the generator's architecture
        spec = policy_spec(spec, init_from, run)
    check_init_from(init_from, spec)
    config = llama3_8b_config(
        tp,
        pp,
        vpp,
        seq_len,
        batch_size,
        global_batch_size,
        schedule,
        spec,
        expert_parallel=ep,
    )
    config.data.data_path, config.data.tokenizer = data_path, tokenizer
    config.data.train_samples = max_steps * global_batch_size
    config.data.cache_dir = f"{run_dir}/data"
    config.init_from = init_from  # weights only: fresh optimizer, step 0
    config.objective = run
    backend = MegatronBackend(config)
    phase = None  # an objective on rollouts: sampled before each step from the weights
    if run.objective.rollouts and not is_planning():
        phase = megatron_rollout_phase(backend, init_from=init_from)
    return Driver(
        backend,
        standard_callbacks(
            save_every=save_every,
            async_save=True,
            console_keys=(*CONSOLE_KEYS, *run.objective.console_keys),
            extra=(RolloutRecords(),) if phase is not None else (),
        ),
        rollouts=phase,
        max_steps=max_steps,
        log_every=10,
        run_dir=run_dir,
        settings={"tokenizer": tokenizer, "lr_schedule": schedule.decay, **run.settings()}
        | ({"model_spec": spec.to_dict()} if spec else {}),
        training_settings=run.objective.fixed_on_resume,
    )
