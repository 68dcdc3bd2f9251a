"""``gpu_speed.py``'s rows of TRL's trainers on the same documents and pairs as baton's
rows: ``SFTTrainer`` (bfd packing to ``seq_len``, ``rows`` rows a step, completion-only
loss) and ``DPOTrainer`` (``pairs`` a step, padded per batch), each with its defaults and
matched to baton's run (no gradient checkpointing; SFT padded to a multiple of 64, DPO's
reference precomputed).

Example::

    setting = Setting(Inputs(Path("/tmp/g"), TINY), "32-true", cuda=False)
    trl_sft(setting, matched=True)
    # Measured(seconds_per_step=0.09, tokens=512, ...,
    #          paths="attention=sdpa gradient_checkpointing=False")
    trl_dpo(setting, matched=False)   # no MFU: its rows are not packed
"""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_speed_measure import Measured, flops_per_token, hf_paths, trl_timer
from benchmarks.gpu_speed_setting import LR, Setting, load_qwen3


def trl_args(setting: Setting, config_type: Any, name: str, batch: int, **extra: Any) -> Any:
    """``config_type`` (``SFTConfig``, ``DPOConfig``) for the setting's steps, constant
    learning rate, clipping at 1.0, no saving or reporting, ``extra`` on top."""
    shape = setting.shape
    return config_type(
        output_dir=str(setting.run_dir(name)), max_steps=shape.steps,
        per_device_train_batch_size=batch, learning_rate=LR, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, report_to="none",
        use_cpu=not setting.cuda, logging_steps=shape.steps, save_strategy="no",
        dataloader_num_workers=0, seed=0, bf16=setting.bf16, **extra,
    )  # fmt: skip


def trl_sft(setting: Setting, matched: bool) -> Measured:
    import datasets
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    shape, inputs = setting.shape, setting.inputs
    window, docs = setting.window(), inputs.sft()[1]
    levers = {"gradient_checkpointing": False, "pad_to_multiple_of": 64} if matched else {}
    args = trl_args(
        setting, SFTConfig, "trl-sft", shape.rows, packing=True, packing_strategy="bfd",
        max_length=shape.seq_len, completion_only_loss=True, **levers,
    )  # fmt: skip
    trainer = SFTTrainer(
        model=load_qwen3(inputs),
        args=args,
        train_dataset=datasets.Dataset.from_dict(
            {"input_ids": [t for t, _ in docs], "completion_mask": [m for _, m in docs]}
        ),
        processing_class=inputs.hf_tokenizer,
        callbacks=[trl_timer(window)],
    )
    trainer.train()
    paths = hf_paths(trainer.model, gradient_checkpointing=args.gradient_checkpointing)
    flops = flops_per_token(shape.qwen3, inputs.qwen3(), shape.seq_len)
    return Measured(window.per_step(), shape.step_tokens, flops, paths)


def trl_sft_defaults(setting: Setting) -> Measured:
    return trl_sft(setting, matched=False)


def trl_sft_matched(setting: Setting) -> Measured:
    return trl_sft(setting, matched=True)


def trl_dpo(setting: Setting, matched: bool) -> Measured:
    import datasets
    from trl.trainer.dpo_config import DPOConfig
    from trl.trainer.dpo_trainer import DPOTrainer

    shape, inputs = setting.shape, setting.inputs
    window, pairs = setting.window(), inputs.pairs()[1]
    levers = {"precompute_ref_log_probs": True, "gradient_checkpointing": False}
    args = trl_args(
        setting, DPOConfig, "trl-dpo", shape.pairs, max_length=None,
        **(levers if matched else {}),
    )  # fmt: skip
    trainer = DPOTrainer(
        model=load_qwen3(inputs),
        ref_model=load_qwen3(inputs),
        args=args,
        train_dataset=datasets.Dataset.from_list(pairs),
        processing_class=inputs.hf_tokenizer,
        callbacks=[trl_timer(window)],
    )
    trainer.train()
    paths = hf_paths(
        trainer.model,
        gradient_checkpointing=args.gradient_checkpointing,
        reference="precomputed" if args.precompute_ref_log_probs else "live",
    )
    note = f"{shape.pairs} pairs a step, padded per batch (no MFU: not packed)"
    return Measured(window.per_step(), paths=paths, note=note)


def trl_dpo_defaults(setting: Setting) -> Measured:
    return trl_dpo(setting, matched=False)


def trl_dpo_matched(setting: Setting) -> Measured:
    return trl_dpo(setting, matched=True)
