"""Llama 2 7B with MaxText on GPUs or TPUs, driven by baton's loop.

The model and parallelism settings follow MaxText's own Llama 2 7B configurations
(``configs/gpu/models/llama2_7b.yml`` and ``configs/tpu/v5p/llama2_7b.sh``): FSDP over
every device by default, remat, cuDNN flash attention through Transformer Engine on GPU
and Pallas flash attention on TPU. MaxText reads the data with its own pipeline: a
prepared dataset or blend (``baton data prepare``; Grain's ``mmap`` source) or local
JSON/Parquet files (its Hugging Face pipeline), tokenized by ``--tokenizer DIR``. Both
are required: a real-size model is not trained on bytes. The learning rate follows
baton's one schedule (``baton.core.lr_schedule``, as MaxText's optax schedule) as on
every LLM recipe, not MaxText's own: ``--lr-schedule`` (default: the objective's, cosine
for pretraining, constant for ``sft``, ``dpo`` and ``grpo``), ``--warmup-steps``
(default 0) and ``--min-lr`` (default ``--lr`` / 10), the decay ending at ``--max-steps``.

On a GPU/TPU host:
    uv run baton run recipes/maxtext_llama2_7b.py --tokenizer tok/ --data-path data/corpus \
        --resume auto
Anywhere (CPU): check the config and a layout against a device count (simulated host
devices), print the mesh MaxText would build, no training (``baton run --dry-run``):
    uv run baton run recipes/maxtext_llama2_7b.py --dry-run --world-size 8
    uv run baton run recipes/maxtext_llama2_7b.py --dry-run --world-size 16 \
        --dp-shard 4 --tp 2 --dp-replicate 2
    uv run baton run recipes/maxtext_llama2_7b.py --dry-run --world-size 16 \
        --model-config qwen3-30b-a3b/ --ep 8 --dp-shard 2      # Qwen3-30B-A3B

Model: Llama 2 7B (MaxText's ``llama2-7b``), or any Llama, Qwen3 or Qwen3-MoE
``config.json`` with ``--model-config DIR_OR_FILE`` (MaxText config keys, scanned layers;
Llama 3.1's ``rope_scaling`` as MaxText's ``llama3.1`` rope; experts on MaxText's sparse
path: grouped matmuls, megablox on TPU, ``ragged_dot`` on GPU), laid out with ``--ep``
too (MaxText's ``ici_expert_parallelism``); ``--init-from HF_DIR`` (a
``save_pretrained`` directory) trains that directory's architecture from its weights,
converted once into ``<run-dir>/hf-params`` (a baton checkpoint: its weights), step 0:
    uv run baton run recipes/maxtext_llama2_7b.py --init-from hf/Llama-2-7b \
        --tokenizer hf/Llama-2-7b --data-path data/corpus
Post-training on prepared conversations or preference pairs (``baton data prepare
--seq-len N``), MaxText's own step and loss (another objective: its step with that
objective's loss, over a reference's log-probabilities computed once, before training,
where it has a reference):
    uv run baton run recipes/maxtext_llama2_7b.py --objective sft --init-from hf/Llama-2-7b \
        --tokenizer hf/Llama-2-7b --data-path data/chat --seq-len 4096
"""

from __future__ import annotations

from pathlib import Path

from baton.backends.maxtext import MaxTextBackend, MaxTextConfig, per_device_batch
from baton.backends.maxtext.objective import check_run_data, checked_reference
from baton.backends.maxtext.qwen3 import check_expert_parallel
from baton.callbacks import standard_callbacks
from baton.core import Driver
from baton.core.cli.dry_run import is_planning, require_data
from baton.core.lr_schedule import resolve_schedule
from baton.core.model.spec import check_init_from, is_hf_dir, resolve_spec
from baton.core.objectives import DataKind, ObjectiveRun
from baton.data import resolve_tokenizer

HARDWARE = {
    "gpu": {
        "hardware": "gpu",
        "attention": "cudnn_flash_te",
        "remat_policy": "minimal_with_context",
        "max_segments_per_seq": 32,
        "scan_layers": False,
        "megablox": False,  # experts: jax's ragged_dot (megablox is a TPU kernel)
    },
    "tpu": {"hardware": "tpu", "attention": "flash", "remat_policy": "minimal"},
}


def recipe(
    hardware: str = "gpu",
    max_steps: int = 1000,
    batch_size: int = 4,
    seq_len: int = 4096,
    lr: float = 3e-4,
    lr_schedule: str | None = None,
    min_lr: float | None = None,
    warmup_steps: int = 0,
    dp_shard: int = -1,
    tp: int = 1,
    dp_replicate: int = 1,
    ep: int = 1,
    dcn_data_parallelism: int = -1,
    data_path: str | None = None,
    tokenizer: str | None = None,
    vocab_size: int = 32000,
    log_every: int = 10,
    save_every: int = 200,
    run_dir: str = "runs/maxtext_llama2_7b",
    init_from: str | None = None,
    model_config: str | None = None,
    objective: ObjectiveRun | str = "pretrain",
) -> Driver:
    """Pre-train Llama 2 7B with MaxText's step (GPU/TPU); --dry-run checks it on CPU.

    --dp-shard, --tp and --dp-replicate lay the mesh out over each host's devices
    (MaxText's ici_* settings; -1: the rest).

    Args:
        hardware: gpu or tpu (attention kernel and remat policy).
        max_steps: optimizer steps to train (MaxText's schedule length).
        batch_size: sequences per step and data-parallel rank (MaxText's per-device
            batch is this over --tp).
        seq_len: tokens per sequence.
        lr: peak learning rate (after warmup).
        lr_schedule: after the warmup: constant, linear or cosine decay to --min-lr at
            --max-steps (default: the objective's, cosine for pretrain, constant for the
            post-training objectives).
        min_lr: the learning rate a decay ends at, at --max-steps (default: --lr / 10).
        warmup_steps: steps of linear warmup (0: none; at most --max-steps).
        dp_shard: FSDP degree within a host (-1: the devices left).
        tp: tensor parallel degree within a host.
        dp_replicate: data parallel degree within a host.
        ep: expert parallel degree within a host (a model with experts;
            ici_expert_parallelism).
        dcn_data_parallelism: data parallel degree across hosts (-1: the rest).
        data_path: a prepared prefix or blend, or JSON/Parquet files (required to train).
        tokenizer: a Hugging Face tokenizer directory (required to train).
        vocab_size: the model's vocabulary rows (at least the tokenizer's; --model-config sets it).
        log_every: steps between log lines.
        save_every: steps between checkpoints (0: only when the run stops).
        run_dir: where checkpoints and logs go.
        init_from: a baton checkpoint or Hugging Face directory whose weights start the run.
        model_config: a Hugging Face Llama, Qwen3 or Qwen3-MoE config.json (or its
            directory) to build.
        objective: what a step minimises, with its settings (a reference model given as
            a Hugging Face directory needs scanned layers: --init-from or --model-config).
    """
    run = ObjectiveRun.of(objective)
    if hardware not in HARDWARE:
        raise ValueError(f"hardware={hardware!r}: use one of {sorted(HARDWARE)}")
    tokenizer = resolve_tokenizer(data_path, tokenizer)  # prepared data names its own
    schedule = resolve_schedule(
        run.objective, lr=lr, max_steps=max_steps, lr_schedule=lr_schedule,
        warmup_steps=warmup_steps, min_lr=min_lr,
    )  # fmt: skip
    require_data(
        "a prepared prefix or blend from `baton data prepare`, or JSON/Parquet files, and a "
        "Hugging Face tokenizer directory of at most --vocab-size tokens",
        data_path=data_path,
        tokenizer=tokenizer,
    )
    overrides = {
        "model_name": "llama2-7b",
        "run_name": "llama2_7b",
        "steps": max_steps,  # MaxText's learning-rate schedule length
        "per_device_batch_size": per_device_batch(batch_size, tp),
        "max_target_length": seq_len,
        "learning_rate": lr,
        "learning_rate_final_fraction": schedule.floor / lr if lr else 0.0,
        "ici_fsdp_parallelism": dp_shard,
        "ici_tensor_parallelism": tp,
        "ici_data_parallelism": dp_replicate,
        "ici_expert_parallelism": ep,
        "dcn_data_parallelism": dcn_data_parallelism,
        "vocab_size": vocab_size,
        "use_iota_embed": True,
        "log_config": False,
        **HARDWARE[hardware],
    }
    spec = resolve_spec(model_config, init_from)
    check_init_from(init_from, spec)
    check_expert_parallel(spec, ep)
    if spec is not None:  # that architecture instead of llama2-7b's (vocabulary included)
        from baton.backends.maxtext.hf import maxtext_settings

        overrides |= {"model_name": "default"} | maxtext_settings(spec)
    config = MaxTextConfig(
        overrides=overrides,
        data_path=data_path,
        tokenizer=tokenizer,
        objective=run,
        init_from=init_from,
        warmup_steps=schedule.warmup_steps,
        lr_schedule=schedule.decay,
    )
    recorded = run.settings()
    if not is_planning():  # data of the wrong kind: refused before anything is built
        vocab = None if run.objective.data is DataKind.TEXT else config.get("vocab_size")
        check_run_data(run, data_path, tokenizer, vocab, seq_len)
        recorded |= checked_reference(config, spec, tokenizer)
    if init_from is not None and not is_planning():  # converted weights: training only
        config["load_parameters_path"] = str(_parameters(init_from, run_dir))
    return Driver(
        MaxTextBackend(config),
        standard_callbacks(save_every=save_every or None, async_save=True),
        max_steps=max_steps,
        log_every=log_every,
        run_dir=run_dir,
        settings={"tokenizer": tokenizer, "lr_schedule": schedule.decay}
        | ({"model_spec": spec.to_dict()} if spec else {})
        | recorded,
        training_settings=run.objective.fixed_on_resume,
    )


def _parameters(init_from: str, run_dir: str) -> Path:
    """MaxText's ``load_parameters_path`` for ``--init-from``: a Hugging Face directory
    converted under the run directory, or a baton checkpoint's parameters."""
    if is_hf_dir(init_from):
        from baton.backends.maxtext.hf import write_params

        return write_params(init_from, f"{run_dir}/hf-params")
    from baton.backends.maxtext.checkpoint import params_path

    return params_path(Path(init_from))
