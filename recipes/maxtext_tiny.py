"""A small MaxText decoder on real text (the Python language reference), on CPU, through baton.

MaxText's own jitted train step runs once per baton step; batches are UTF-8 bytes of
the text (vocabulary 256); checkpoints are orbax, asynchronous, in MaxText's layout.

uv run baton run recipes/maxtext_tiny.py --max-steps 50
uv run baton run recipes/maxtext_tiny.py --max-steps 100 --resume auto
uv run baton run recipes/maxtext_tiny.py --overrides base_num_decoder_layers=4 learning_rate=1e-3
"""

from __future__ import annotations

from baton.backends.maxtext import TINY_CPU, MaxTextBackend, MaxTextConfig
from baton.callbacks import CONSOLE_KEYS, standard_callbacks
from baton.core import Driver


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
    per_device_batch_size: int = 4,
    seq_len: int = 64,
    layers: int = 2,
    d_model: int = 64,
    heads: int = 4,
    seed: int = 0,
    data_seed: int = 0,
    log_every: int = 10,
    eval_every: int = 25,
    save_every: int = 25,
    async_save: bool = True,
    data_path: str | None = None,
    run_dir: str = "runs/maxtext_tiny",
    progress: bool = True,
    print_loss: bool = True,
    overrides: tuple[str, ...] = (),
) -> Driver:
    """Train a small MaxText decoder on bytes of real English text on CPU."""
    settings = TINY_CPU | {
        "run_name": "maxtext_tiny",
        "steps": max_steps,  # MaxText's learning-rate schedule length
        "learning_rate": lr,
        "per_device_batch_size": per_device_batch_size,
        "max_target_length": seq_len,
        "base_num_decoder_layers": layers,
        "base_emb_dim": d_model,
        "base_mlp_dim": 2 * d_model,
        "base_num_query_heads": heads,
        "base_num_kv_heads": heads,
        "head_dim": d_model // heads,
        "init_weights_seed": seed,
    }
    config = MaxTextConfig(
        overrides=settings | parse_overrides(overrides), data_path=data_path, data_seed=data_seed
    )
    callbacks = standard_callbacks(
        save_every=save_every,
        save_on_stop=save_every > 0,
        async_save=async_save,
        console_keys=CONSOLE_KEYS if print_loss else None,
        progress=progress,
    )
    return Driver(
        MaxTextBackend(config),
        callbacks,
        max_steps=max_steps,
        log_every=log_every,
        eval_every=eval_every or None,
        run_dir=run_dir,
    )
