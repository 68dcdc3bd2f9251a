"""What may change when a run resumes: settings that alter training are compared with
the ones the checkpoint recorded, and a change is refused unless it is allowed by name.

A checkpoint's ``baton.json`` records the recipe's settings (``"settings"``) and the
driver's limits (``"driver"``). Resuming with another learning rate, schedule length,
batch size, sequence length, data or tokenizer would otherwise train on a state that
no longer matches what is recorded::

    changes = changed_settings(saved, current, TRAINING_SETTINGS)
    # {"lr": (0.002, 1e-05)}
    check_changes(changes, allowed={"max_steps"}, checkpoint=path)
    # UsageError: resuming from ... would change lr (0.002 -> 1e-05) ...
    #             pass --allow-changed lr to resume with the new value anyway

Recipes and backends add their own names: ``Driver(training_settings={"vocab_file"})``
or a backend attribute ``training_settings``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from baton.core.errors import UsageError

#: settings whose change alters training (a recipe parameter or driver limit of that name)
TRAINING_SETTINGS: frozenset[str] = frozenset(
    {
        "lr",
        "learning_rate",
        "min_lr",
        "min_lr_ratio",
        "warmup_steps",
        "decay_steps",
        "max_steps",
        "max_tokens",
        "batch_size",
        "global_batch_size",
        "micro_batch_size",
        "seq_len",
        "seq_length",
        "sequence_length",
        "data",
        "data_path",
        "dataset",
        "dataset_path",
        "tokenizer",
        "tokenizer_path",
    }
)


def parse_allowed(text: str | Iterable[str] | None) -> set[str]:
    """``"lr,max_steps"`` (or a list) -> ``{"lr", "max_steps"}``; ``"all"`` allows every one."""
    if text is None:
        return set()
    items = text.split(",") if isinstance(text, str) else list(text)
    return {item.strip().replace("-", "_") for item in items if item.strip()}


def changed_settings(
    saved: Mapping[str, Any], current: Mapping[str, Any], names: Iterable[str]
) -> dict[str, tuple[Any, Any]]:
    """``name -> (saved, current)`` for each of ``names`` recorded in both and different."""
    return {
        name: (saved[name], current[name])
        for name in sorted(set(names))
        if name in saved and name in current and saved[name] != current[name]
    }


def check_changes(
    changes: Mapping[str, tuple[Any, Any]], allowed: set[str], checkpoint: Path
) -> dict[str, tuple[Any, Any]]:
    """Raise ``UsageError`` for changes not in ``allowed``; return the allowed ones."""
    refused = {k: v for k, v in changes.items() if k not in allowed and "all" not in allowed}
    if refused:
        described = ", ".join(f"{k} ({old!r} -> {new!r})" for k, (old, new) in refused.items())
        raise UsageError(
            f"resuming from {checkpoint} would change {described}, which alters training; "
            f"resume with the checkpoint's values, or pass --allow-changed "
            f"{','.join(refused)} to resume with the new ones anyway"
        )
    return dict(changes)
