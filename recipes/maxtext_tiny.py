"""A small MaxText decoder on real text (the Python language reference), on CPU, through baton.

MaxText's own jitted train step runs once per baton step; checkpoints are orbax,
asynchronous, in MaxText's layout. Without --tokenizer, batches are UTF-8 bytes of the
text (vocabulary 256, nothing to prepare). With --tokenizer DIR and --data-path, MaxText
reads the data with its own pipeline: a prepared dataset or blend through Grain's mmap
source, or local JSON/Parquet files through its Hugging Face pipeline.

uv run baton run recipes/maxtext_tiny.py --max-steps 50
uv run baton run recipes/maxtext_tiny.py --max-steps 100 --resume auto
uv run baton run recipes/maxtext_tiny.py --overrides base_num_decoder_layers=4 learning_rate=1e-3
uv run baton run recipes/maxtext_tiny.py --tokenizer runs/tok --data-path data/corpus
uv run baton run recipes/maxtext_tiny.py --tokenizer runs/tok --data-path "0.7 data/a 0.3 data/b"
uv run baton run recipes/maxtext_tiny.py --tokenizer runs/tok --data-path data/corpus \
    --eval-data-path data/heldout --eval-every 25   # MaxText's pipeline evaluates too
uv run baton run recipes/maxtext_tiny.py --devices 4 --dp-shard 2 --tp 2   # a mesh of 4 CPUs
uv run baton run recipes/maxtext_tiny.py --init-from tiny-qwen3-moe/ --devices 2 --ep 2 \
    --dp-shard 1                                  # experts split over 2 CPUs
uv run baton run recipes/maxtext_tiny.py --init-from runs/maxtext_tiny/checkpoints/step_000050
uv run baton run recipes/maxtext_tiny.py --objective sft --tokenizer tok/ --data-path data/chat \
    --seq-len 512 --init-from hf-model/           # prepared conversations (baton data prepare)
uv run baton run recipes/maxtext_tiny.py --objective dpo --tokenizer tok/ --data-path data/pairs \
    --seq-len 512 --init-from sft-model/ --dpo-beta 0.1 --dpo-loss ipo
uv run baton run recipes/maxtext_tiny.py --objective examples/objectives/focal.py:FOCAL \
    --focal-gamma 2 --tokenizer tok/ --data-path data/chat --seq-len 512 --init-from hf-model/
uv run baton run recipes/maxtext_tiny.py --objective grpo --tokenizer tok/ \
    --data-path data/prompts --init-from sft-model/ --reward rewards.py:fn \
    --num-generations 8 --batch-size 16 --max-prompt-length 256 \
    --max-completion-length 256 --seq-len 512      # online RL on rollouts sampled each step
"""

from __future__ import annotations

from pathlib import Path

from baton.backends.maxtext import TINY_CPU, MaxTextBackend, MaxTextConfig, per_device_batch
from baton.backends.maxtext.checkpoint import params_path
from baton.backends.maxtext.objective import check_run_data, checked_reference
from baton.backends.maxtext.qwen3 import check_expert_parallel
from baton.backends.maxtext.rollout_phase import maxtext_rollout_phase
from baton.backends.rollouts.policy import policy_spec
from baton.callbacks import CONSOLE_KEYS, RolloutRecords, standard_callbacks
from baton.core import Driver
from baton.core.cli.dry_run import is_planning
from baton.core.errors import UsageError
from baton.core.lr_schedule import resolve_schedule
from baton.core.model.spec import check_init_from, is_hf_dir, resolve_spec
from baton.core.objectives import DataKind, ObjectiveRun
from baton.data import resolve_tokenizer


def parse_overrides(items: tuple[str, ...]) -> dict[str, str]:
    """``("key=value", ...)`` -> dict; MaxText parses the values (YAML types)."""
    parsed: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value (e.g. learning_rate=1e-3)")
        parsed[key.strip()] = value.strip()
    return parsed


def recipe(
    max_steps: int = 50,
    lr: float = 3e-3,
    lr_schedule: str | None = None,
    min_lr: float | None = None,
    warmup_steps: int = 0,
    batch_size: int = 4,
    seq_len: int = 64,
    layers: int = 2,
    d_model: int = 64,
    heads: int = 4,
    seed: int = 0,
    data_seed: int = 0,
    log_every: int = 10,
    eval_every: int | None = None,
    save_every: int = 25,
    async_save: bool = True,
    data_path: str | None = None,
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
    devices: int | None = None,
    dp_replicate: int = 1,
    dp_shard: int = -1,
    tp: int = 1,
    ep: int = 1,
    init_from: str | None = None,
    model_config: str | None = None,
    objective: ObjectiveRun | str = "pretrain",
    run_dir: str = "runs/maxtext_tiny",
    progress: bool = True,
    print_loss: bool = True,
    overrides: tuple[str, ...] = (),
) -> Driver:
    """Train a small MaxText decoder on real text on CPU (bytes, or tokens with --tokenizer).

    --devices N simulates N CPU devices (a fresh process); the ici_* flags lay the mesh
    out over them (-1: the rest). --init-from starts from a checkpoint's weights only
    (MaxText's load_parameters_path): fresh optimizer, step 0. --model-config (a Hugging
    Face Llama config.json) builds that architecture; --init-from HF_DIR builds the
    directory's and starts from its weights (converted to a MaxText parameter checkpoint
    under the run directory). --objective trains what a declared objective minimises
    (its settings are flags too): pretrain reads text; sft, dpo and others read one
    prepared dataset (--data-path PREFIX --tokenizer DIR); an objective with a reference
    model scores the data with it once, before training; grpo samples completions of
    prepared prompts each step (--data-path PROMPTS_PREFIX, a Hugging Face architecture:
    --init-from HF_DIR, --model-config or a checkpoint of such a run), its rollouts per
    step MaxText's global batch (--batch-size x data-parallel devices x gradient
    accumulation), rows of --seq-len tokens holding the longest prompt and completion.

    Args:
        max_steps: optimizer steps to train (MaxText's schedule length).
        lr: peak learning rate (after warmup).
        lr_schedule: after the warmup: constant, linear or cosine decay to --min-lr at
            --max-steps (default: the objective's, cosine for pretrain, constant for the
            post-training objectives).
        min_lr: the learning rate a decay ends at, at --max-steps (default: --lr / 10).
        warmup_steps: steps of linear warmup (0: none; at most --max-steps).
        batch_size: sequences per step and data-parallel rank (MaxText's per-device
            batch is this over --tp); rollouts for an objective that samples them.
        seq_len: tokens per sequence.
        layers: decoder layers.
        d_model: model width (the MLP is twice as wide).
        heads: attention heads (query and key/value).
        seed: seed of the initial weights.
        data_seed: seed of the data order.
        log_every: steps between log lines.
        eval_every: steps between evaluations (0: none; None: 25 where there is eval data).
        save_every: steps between checkpoints (0: only when the run stops;
            --no-callback checkpoint: none at all).
        async_save: write checkpoints in the background.
        data_path: with --tokenizer: a prepared prefix or blend, or JSON/Parquet files.
        eval_split: an objective on prepared rows: the fraction of its packed rows held
            out for evaluation, the last ones (0: none; nothing is held out unless asked).
        eval_data_path: with --tokenizer: evaluation data, the same kind as --data-path.
        tokenizer: a Hugging Face tokenizer directory (None: UTF-8 bytes).
        vocab_size: embedding rows (None: the tokenizer's rounded up to 128, or 256).
        devices: CPU devices to simulate (None: the real ones).
        dp_replicate: data parallel degree of the mesh (MaxText's ici_data_parallelism).
        dp_shard: FSDP degree of the mesh (-1: the devices left; ici_fsdp_parallelism).
        tp: tensor parallel degree of the mesh (ici_tensor_parallelism).
        ep: expert parallel degree of the mesh, a model with experts
            (ici_expert_parallelism; MaxText also splits the batch over it).
        init_from: a baton checkpoint or Hugging Face directory whose weights start the run.
        model_config: a Hugging Face Llama, Qwen3 or Qwen3-MoE config.json (or its
            directory) to build (experts on MaxText's dense CPU path).
        objective: what a step minimises, with its settings.
        run_dir: where checkpoints and logs go.
        progress: show the progress bar.
        print_loss: print the loss line on log steps.
        overrides: further MaxText settings as key=value, applied last.
    """
    run = ObjectiveRun.of(objective)
    run.check_held_out(eval_split=eval_split, eval_data_path=eval_data_path)
    tokenizer = resolve_tokenizer(data_path, tokenizer, eval_data_path)  # the data names its own
    schedule = resolve_schedule(
        run.objective, lr=lr, max_steps=max_steps, lr_schedule=lr_schedule,
        warmup_steps=warmup_steps, min_lr=min_lr,
    )  # fmt: skip
    if tokenizer is not None and vocab_size is None:
        from baton.data import load_tokenizer

        size = load_tokenizer(tokenizer).vocab_size
        vocab_size = -(-size // 128) * 128  # the embedding rounded up to a multiple of 128
    settings = TINY_CPU | {
        "run_name": "maxtext_tiny",
        "steps": max_steps,  # MaxText's learning-rate schedule length
        "learning_rate": lr,
        "learning_rate_final_fraction": schedule.floor / lr if lr else 0.0,
        "per_device_batch_size": per_device_batch(batch_size, tp),
        "max_target_length": seq_len,
        "base_num_decoder_layers": layers,
        "base_emb_dim": d_model,
        "base_mlp_dim": 2 * d_model,
        "base_num_query_heads": heads,
        "base_num_kv_heads": heads,
        "head_dim": d_model // heads,
        "init_weights_seed": seed,
        "ici_data_parallelism": dp_replicate,
        "ici_fsdp_parallelism": dp_shard,
        "ici_tensor_parallelism": tp,
        "ici_expert_parallelism": ep,
    }
    if vocab_size is not None:
        settings["vocab_size"] = vocab_size
    if tokenizer is not None:
        settings["grain_worker_count"] = 0  # read in this process: CPU-friendly
        settings["grain_worker_count_eval"] = 0
    reads_text = run.objective.data is DataKind.TEXT
    if reads_text:
        if eval_split:
            raise UsageError(
                "--eval-split holds packed rows out for an objective on prepared rows; "
                "MaxText's own pipelines evaluate on separate files: pass --eval-data-path"
            )
        has_eval_data = tokenizer is None or eval_data_path is not None
    else:  # held-out packed rows: the last ones, or other prepared data
        has_eval_data = bool(eval_split or eval_data_path is not None)
    if eval_every is None:  # by default: evaluate whenever there is data to evaluate on
        eval_every = 25 if has_eval_data else 0
    elif eval_every and not has_eval_data and not reads_text:
        raise UsageError(
            f"--eval-every {eval_every} needs held-out rows: pass --eval-split F (the last "
            "rows of --data-path) or --eval-data-path PREFIX, or --eval-every 0"
        )
    elif eval_every and not has_eval_data:
        raise UsageError(
            f"--eval-every {eval_every} with --data-path: MaxText's own pipelines evaluate "
            "on separate data; pass --eval-data-path (a prepared prefix or JSON/Parquet "
            "files like --data-path), or --eval-every 0"
        )
    spec = resolve_spec(model_config, init_from)
    if run.objective.rollouts:  # the generator runs the policy's Hugging Face architecture
        spec = policy_spec(spec, init_from, run)
    check_init_from(init_from, spec)
    check_expert_parallel(spec, ep)
    if spec is not None:
        from baton.backends.maxtext.hf import maxtext_settings
        from baton.backends.maxtext.qwen3 import CPU_EXPERTS

        settings |= maxtext_settings(spec) | (CPU_EXPERTS if spec.moe is not None else {})
    config = MaxTextConfig(
        overrides=settings | parse_overrides(overrides),
        data_path=data_path,
        eval_data_path=eval_data_path,
        eval_split=eval_split,
        tokenizer=tokenizer,
        data_seed=data_seed,
        host_devices=devices,
        objective=run,
        init_from=init_from,
        warmup_steps=schedule.warmup_steps,
        lr_schedule=schedule.decay,
        model_spec=spec,
    )
    vocab = None if reads_text else config.get("vocab_size")
    check_run_data(run, data_path, tokenizer, vocab, seq_len)  # before anything is written
    if not reads_text and not run.objective.rollouts:  # held-out rows that do not fit
        # are refused before anything is built (rollouts: nothing is held out)
        from baton.data.packed import PackedDataset, held_out_rows

        held_out_rows(
            PackedDataset(str(data_path)), run.name, eval_split=eval_split,
            eval_data_path=eval_data_path,
        )  # fmt: skip
    recorded = run.settings() | checked_reference(config, spec, tokenizer)
    backend = MaxTextBackend(config)
    # an objective on rollouts: each step's are sampled before it, on the backend's weights
    phase = (
        maxtext_rollout_phase(backend, init_from=init_from, devices=devices)
        if run.objective.rollouts and not is_planning()  # a dry run samples nothing
        else None
    )
    if init_from is not None and is_hf_dir(init_from):
        from baton.backends.maxtext.hf import write_params, write_params_apart

        # simulated devices: JAX starts in the run, so the conversion runs in a child
        convert = write_params_apart if devices else write_params
        config["load_parameters_path"] = str(convert(init_from, f"{run_dir}/hf-params"))
    elif init_from is not None:
        config["load_parameters_path"] = str(params_path(Path(init_from)))
    callbacks = standard_callbacks(
        save_every=save_every or None,
        async_save=async_save,
        console_keys=(*CONSOLE_KEYS, *run.objective.console_keys) if print_loss else None,
        progress=progress,
        extra=(RolloutRecords(),) if phase is not None else (),
    )
    return Driver(
        backend,
        callbacks,
        rollouts=phase,
        max_steps=max_steps,
        log_every=log_every,
        eval_every=eval_every or None,
        run_dir=run_dir,
        settings={"tokenizer": tokenizer, "lr_schedule": schedule.decay}
        | ({"model_spec": spec.to_dict()} if spec else {})
        | recorded,
        training_settings=run.objective.fixed_on_resume,
    )
