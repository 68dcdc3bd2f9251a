"""Quickstart: a small byte-level GPT on the Python language reference, on CPU in about a minute.

uv run baton run recipes/quickstart.py
uv run baton run recipes/quickstart.py --max-steps 600 --resume auto --allow-changed max_steps
OMP_NUM_THREADS=1 uv run torchrun --nproc-per-node 2 -m baton.core.cli.command run recipes/quickstart.py
uv run baton run recipes/quickstart.py --data-path data/corpus --tokenizer runs/tok
uv run baton run recipes/quickstart.py --data-path data/corpus --tokenizer runs/tok --eval-split 0.05

Without ``--tokenizer`` it trains on UTF-8 bytes (of ``--data-path``, else the Python
language reference); with it, ``--data-path`` is a prepared dataset or blend (``baton
data prepare``) or ``.jsonl``/``.parquet``/``.txt`` files tokenized with ``datasets``,
all of it trained on unless ``--eval-split F`` (the last documents) or
``--eval-data-path`` gives evaluation data (the byte corpus evaluates on its tail).

The model, data and optimizer are ordinary PyTorch objects handed to ``FabricBackend``
(``baton.backends.fabric.models.gpt`` holds them); bring your own the same way.
"""

from __future__ import annotations

from baton.backends.fabric import FabricBackend, FabricConfig
from baton.backends.fabric.models.gpt import GPT, GPTConfig, adamw, byte_loaders, warmup_cosine
from baton.backends.fabric.text import text_loaders
from baton.callbacks import standard_callbacks
from baton.core import Driver
from baton.core.errors import UsageError


def recipe(
    max_steps: int = 300,
    lr: float = 2e-3,
    batch_size: int = 16,
    seq_len: int = 128,
    layers: int = 4,
    d_model: int = 128,
    heads: int = 4,
    seed: int = 0,
    grad_accum: int = 1,
    grad_clip: float = 1.0,
    precision: str = "32-true",
    accelerator: str = "cpu",
    strategy: str = "auto",
    log_every: int = 25,
    eval_every: int | None = None,
    save_every: int = 100,
    data_path: str | None = None,
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
    tokenizer: str | None = None,
    text_key: str = "text",
    run_dir: str = "runs/quickstart",
    progress: bool = True,
    wandb_project: str | None = None,
    wandb_mode: str | None = None,
) -> Driver:
    """Train a small GPT on bytes of real English text (the Python language reference).

    Args:
        max_steps: optimizer steps to train (the cosine schedule decays over them).
        lr: peak learning rate (after warmup).
        batch_size: sequences per step and rank.
        seq_len: tokens per sequence.
        layers: transformer blocks.
        d_model: model width.
        heads: attention heads.
        seed: seed of the weights and of the data order.
        grad_accum: micro-batches accumulated per optimizer step.
        grad_clip: gradient norm clipping threshold (0: no clipping).
        precision: Lightning precision: 32-true, bf16-mixed, 16-mixed.
        accelerator: cpu, cuda or auto.
        strategy: auto, ddp or fsdp (devices and nodes come from the launcher).
        log_every: steps between log lines (metrics reach the host only then).
        eval_every: steps between evaluations (0: none; None: 100 where there is
            evaluation data, else none).
        save_every: steps between checkpoints (0: only when the run stops).
        data_path: a text file (bytes), or with --tokenizer a prepared dataset, blend or
            .jsonl/.parquet/.txt files.
        eval_split: with --tokenizer: the fraction of the documents held out for
            evaluation, the last ones (0: none).
        eval_data_path: with --tokenizer: evaluation data, the same kind as --data-path.
        tokenizer: a Hugging Face tokenizer directory (baton data tokenizer).
        text_key: the text field of .jsonl/.parquet records.
        run_dir: where checkpoints and logs go.
        progress: show the progress bar.
        wandb_project: also log to this W&B project.
        wandb_mode: W&B mode: online, offline or disabled.
    """
    if tokenizer is None and (eval_split or eval_data_path is not None):
        raise UsageError(
            "--eval-split and --eval-data-path read tokenized data: pass --tokenizer DIR "
            "(byte runs evaluate on the tail of the text)"
        )
    if tokenizer is None:
        train, val = byte_loaders(seq_len=seq_len, batch_size=batch_size, seed=seed, path=data_path)
        vocab = 256
    elif data_path is None:
        raise ValueError("--tokenizer needs --data-path (a prepared dataset or text files)")
    else:
        train, val, vocab = text_loaders(
            data_path,
            tokenizer,
            seq_len=seq_len,
            batch_size=batch_size,
            seed=seed,
            text_key=text_key,
            eval_split=eval_split,
            eval_data_path=eval_data_path,
        )
    if eval_every is None:  # by default: evaluate whenever there is data to evaluate on
        eval_every = 100 if val is not None else 0
    shape = GPTConfig(
        n_layer=layers, d_model=d_model, n_head=heads, seq_len=seq_len, vocab_size=vocab
    )
    backend = FabricBackend(
        model=lambda: GPT(shape),  # built in setup, after seeding
        optimizer=adamw(lr),
        scheduler=warmup_cosine(warmup_steps=min(20, max_steps), decay_steps=max_steps),
        data=train,
        eval_data=val,
        flops_per_token=shape.flops_per_token(),
        describe={"model": shape.to_dict()},
        config=FabricConfig(
            accelerator=accelerator,
            strategy=strategy,  # devices and nodes come from the launcher (torchrun, SLURM)
            precision=precision,
            grad_accum=grad_accum,
            grad_clip=grad_clip or None,  # 0: no clipping
            seed=seed,
        ),
    )
    return Driver(
        backend,
        standard_callbacks(
            save_every=save_every,
            progress=progress,
            wandb_project=wandb_project,
            wandb_mode=wandb_mode,
        ),
        max_steps=max_steps,
        log_every=log_every,
        eval_every=eval_every,
        run_dir=run_dir,
    )
