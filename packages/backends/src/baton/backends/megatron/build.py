"""Building Megatron-Core's pieces from a ``MegatronConfig``: the layer spec, the
DDP-wrapped ``GPTModel`` chunks of this rank, the optimizer and its LR scheduler.

Example::

    layer_choice(config)                      # "transformer_engine" or "local"
    unfused_attention_line("local", te_installed=False, gpu=True)  # the line to log, or None
    chunks = build_model(config, vocab_size=50304, device=torch.device("cpu"))
    optimizer, scheduler = build_optimizer(config, chunks)
    scheduler = param_scheduler(config, torch.optim.SGD(params, lr=0.0))  # the schedule alone
"""

from __future__ import annotations

from typing import Any

import torch

from baton.backends.megatron.config import MegatronConfig
from baton.core.errors import UsageError


def transformer_engine_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


#: what to install for Transformer Engine's layers (fused attention, fused norms)
TRANSFORMER_ENGINE_PACKAGE = "transformer-engine[pytorch]"


def layer_choice(config: MegatronConfig) -> str:
    """The layers ``config.layer_spec`` resolves to: ``"transformer_engine"`` or
    ``"local"`` (``auto``: Transformer Engine's where it is installed and a GPU is
    present, else Megatron's local ones; the local ones for packed rows, which need
    their attention mask). ``UsageError`` for ``transformer_engine`` where it is not
    installed."""
    choice = config.layer_spec
    if choice == "auto":  # post-training's packed rows need the local layers' mask
        te = transformer_engine_available() and torch.cuda.is_available()
        te = te and not config.packed_rows
        return "transformer_engine" if te else "local"
    if choice == "transformer_engine" and not transformer_engine_available():
        raise UsageError(
            "layer_spec transformer_engine: Transformer Engine is not installed; "
            f"pip install {TRANSFORMER_ENGINE_PACKAGE}, or set layer_spec to auto or local"
        )
    return choice


def unfused_attention_line(choice: str, *, te_installed: bool, gpu: bool) -> str | None:
    """The one line a run on a GPU logs when it builds Megatron's local layers because
    Transformer Engine is not installed (its attention then runs unfused); ``None``
    elsewhere: on a CPU the local layers are the expected ones, and where Transformer
    Engine is installed installing it changes nothing."""
    if choice != "local" or te_installed or not gpu:
        return None
    return (
        "Megatron-Core: attention runs unfused (Megatron's local layers): Transformer "
        f"Engine is not installed; pip install {TRANSFORMER_ENGINE_PACKAGE} for its fused "
        "attention and layers"
    )


def layer_spec(config: MegatronConfig, vp_stage: int | None = None) -> Any:
    """The transformer layer spec of :func:`layer_choice`. A model with experts gets
    Megatron's decoder block spec: MoE layers where ``moe_layer_freq`` says, dense ones
    elsewhere (this pipeline stage's layers)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    choice = layer_choice(config)
    model = config.model
    if model.num_moe_experts:
        return specs.get_gpt_decoder_block_spec(
            model,
            use_transformer_engine=choice == "transformer_engine",
            normalization=model.normalization,
            vp_stage=vp_stage,
        )
    if choice == "transformer_engine":
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=model.qk_layernorm)
    return specs.get_gpt_layer_local_spec(
        normalization=model.normalization, qk_layernorm=model.qk_layernorm
    )


def build_model(config: MegatronConfig, *, vocab_size: int, device: Any) -> list[Any]:
    """This rank's GPTModel chunks, each in Megatron's DDP (one chunk per virtual
    pipeline stage; bucketing only on the first, as Megatron-LM does). In bf16 or fp16
    the model is in Megatron's ``Float16Module`` inside DDP, as Megatron-LM builds it:
    its weights in half precision, the optimizer's fp32 main copies beside them."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.module import Float16Module

    cfg = config
    virtual = cfg.model.virtual_pipeline_model_parallel_size
    stages: list[int | None] = list(range(virtual)) if virtual else [None]
    chunks = []
    for stage in stages:
        model = GPTModel(
            config=cfg.model,
            transformer_layer_spec=layer_spec(cfg, stage),
            vocab_size=vocab_size,
            max_sequence_length=cfg.seq_len,
            pre_process=parallel_state.is_pipeline_first_stage(
                ignore_virtual=False, vp_stage=stage
            ),
            post_process=parallel_state.is_pipeline_last_stage(
                ignore_virtual=False, vp_stage=stage
            ),
            share_embeddings_and_output_weights=cfg.share_embeddings_and_output_weights,
            position_embedding_type=cfg.position_embedding_type,
            rotary_base=cfg.rotary_base,  # pyright: ignore[reportArgumentType]
            rope_scaling=cfg.rope_scaling,
            rope_scaling_factor=cfg.rope_scaling_factor,
            vp_stage=stage,
        )
        model.to(device)
        if cfg.model.bf16 or cfg.model.fp16:
            model = Float16Module(cfg.model, model)
        chunks.append(
            DistributedDataParallel(cfg.model, cfg.ddp, model, disable_bucketing=bool(stage))
        )
    return chunks


def build_optimizer(config: MegatronConfig, chunks: list[Any]) -> tuple[Any, Any]:
    """``get_megatron_optimizer`` over ``chunks`` and its ``OptimizerParamScheduler``
    (``param_scheduler``), as ``BatonParamScheduler`` (which keeps what a callback set
    through ``model_state``)."""
    from megatron.core.optimizer import get_megatron_optimizer

    cfg = config
    opt = cfg.optimizer
    peak_and_floor(cfg)  # checked before the optimizer is built
    if cfg.ddp.use_distributed_optimizer != opt.use_distributed_optimizer:
        opt.use_distributed_optimizer = cfg.ddp.use_distributed_optimizer
    optimizer = get_megatron_optimizer(opt, chunks)
    return optimizer, param_scheduler(cfg, optimizer)


def param_scheduler(config: MegatronConfig, optimizer: Any) -> Any:
    """The ``BatonParamScheduler`` of ``optimizer`` for ``config``: warmup, then the
    decay style over ``decay_steps`` (constant without them); constant, linear and
    cosine are baton's schedule (``scheduler.schedule_arguments``), followed exactly."""
    from baton.backends.megatron.scheduler import BatonParamScheduler, schedule_arguments
    from baton.core.lr_schedule import SHAPES, LRSchedule

    cfg = config
    opt = cfg.optimizer
    peak, floor = peak_and_floor(cfg)
    decay = cfg.decay_steps
    style = cfg.decay_style if decay is not None else "constant"
    schedule: dict[str, Any] = {
        "init_lr": 0.0,
        "max_lr": peak,
        "min_lr": floor,
        "lr_warmup_steps": cfg.warmup_steps,
        "lr_decay_steps": max(decay or 0, cfg.warmup_steps + 1),
        "lr_decay_style": style,
    }
    shape = None
    if style in SHAPES and decay is not None:  # baton's schedule, as on every backend
        shape = LRSchedule(peak, floor, min(cfg.warmup_steps, decay), decay, style)
        schedule = schedule_arguments(shape)
    scheduler = BatonParamScheduler(
        optimizer,
        **schedule,
        start_wd=opt.weight_decay,
        end_wd=opt.weight_decay,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )
    if shape is not None:
        scheduler.follow(shape)
    return scheduler


def peak_and_floor(config: MegatronConfig) -> tuple[float, float]:
    """``config.optimizer``'s ``lr`` and ``min_lr`` (the schedule's peak and floor);
    an error when one is missing or the floor is outside ``[0, lr]``."""
    opt = config.optimizer
    if opt.lr is None or opt.min_lr is None:
        raise ValueError(
            "config.optimizer needs lr and min_lr (the schedule's peak and floor), "
            f"got lr={opt.lr}, min_lr={opt.min_lr}"
        )
    if not 0 <= opt.min_lr <= opt.lr:  # Megatron's scheduler asserts it
        raise UsageError(
            f"config.optimizer.min_lr ({opt.min_lr:g}) must be between 0 and "
            f"config.optimizer.lr ({opt.lr:g}): the schedule decays from lr down to min_lr; "
            "lower min_lr (recipes: --min-lr)"
        )
    return opt.lr, opt.min_lr
