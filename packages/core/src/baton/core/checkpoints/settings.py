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

The arguments of the callbacks a run added (``--callback ema:decay=0.95``, recorded in
the settings' ``callbacks``) are settings too, named ``LABEL.argument``::

    changed_callback_settings(saved, current)
    # {"ema.decay": (0.95, 0.5)}: refused unless --allow-changed ema.decay

Settings that shape the model (``layers``, ``d_model``, ``heads``, ...) may not change at
all: ``check_same_shape`` refuses them before the backend builds anything.

Before any setting is compared, the checkpoint must be this run's at all
(``check_same_run``): written by the same backend and recipe, else the directory holds
another experiment and no ``--allow-changed`` makes it this one::

    check_same_run(meta, backend="megatron", settings={"recipe": "recipes/megatron_gpt_tiny.py"},
                   checkpoint=path)
    # UsageError: checkpoint ... belongs to another run: backend 'fabric', recipe
    #             recipes/quickstart.py (this run: backend 'megatron', ...); ...
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from baton.core.callback_paths import class_label
from baton.core.checkpoints.files import run_dir_of
from baton.core.errors import UsageError

#: recipe settings that shape the model: a checkpoint of another shape cannot load into
#: it, whatever ``--allow-changed`` says
ARCHITECTURE_SETTINGS: frozenset[str] = frozenset(
    {
        "layers",
        "num_layers",
        "d_model",
        "hidden_size",
        "ffn_hidden_size",
        "heads",
        "kv_heads",
        "num_attention_heads",
        "vocab_size",
        "llama",
    }
)


def check_same_shape(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, checkpoint: Path
) -> None:
    """Refuse (``UsageError``) a resume whose recipe builds a model of another shape than
    the checkpoint's (``--layers 3`` against a 2-layer checkpoint), before anything is
    built: naming the setting, both values and the way out."""
    changes = changed_settings(saved, current, ARCHITECTURE_SETTINGS)
    if not changes:
        return
    name, (old, new) = next(iter(changes.items()))
    flag = "--" + name.replace("_", "-")
    raise UsageError(
        f"checkpoint {checkpoint} holds a model built with {name} {old!r}, this run builds "
        f"{name} {new!r}: its weights cannot load into another shape; resume with "
        f"{flag} {old} (or without {flag}), or start a new --run-dir"
    )


def check_same_run(
    meta: Mapping[str, Any], *, backend: str, settings: Mapping[str, Any], checkpoint: Path
) -> None:
    """Refuse (``UsageError``) a checkpoint another backend or recipe wrote, naming the
    recipe its directory holds and the way out: a new ``--run-dir``."""
    saved_backend = meta.get("backend", {}).get("name")
    saved_recipe = meta.get("settings", {}).get("recipe")
    recipe = settings.get("recipe")
    other_backend = saved_backend is not None and saved_backend != backend
    other_recipe = (
        saved_recipe is not None
        and recipe is not None
        and Path(str(saved_recipe)).name != Path(str(recipe)).name
    )
    if not (other_backend or other_recipe):
        return
    theirs = f"backend {saved_backend!r}" + (f", recipe {saved_recipe}" if saved_recipe else "")
    ours = f"backend {backend!r}" + (f", recipe {recipe}" if recipe else "")
    run_dir = run_dir_of(checkpoint)
    where = f" of {run_dir}" if run_dir is not None else ""
    raise UsageError(
        f"checkpoint {checkpoint}{where} belongs to another run ({theirs}; this run: {ours}); "
        "give this run a new --run-dir, or resume that run with its own recipe"
    )


def changed_settings(
    saved: Mapping[str, Any], current: Mapping[str, Any], names: Iterable[str]
) -> dict[str, tuple[Any, Any]]:
    """``name -> (saved, current)`` for each of ``names`` recorded in both and different."""
    return {
        name: (saved[name], current[name])
        for name in sorted(set(names))
        if name in saved and name in current and saved[name] != current[name]
    }


def callback_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``LABEL.argument -> value`` for each callback the settings record (``callbacks``:
    ``[{"name": "ema", "decay": 0.95}]`` -> ``{"ema.decay": 0.95}``); a class path's label
    is its class name."""
    flat: dict[str, Any] = {}
    records: Any = settings.get("callbacks")
    for record in cast(list[Any], records) if isinstance(records, list) else []:
        table = cast(dict[str, Any], record) if isinstance(record, dict) else {}
        name = table.get("name")
        if isinstance(name, str):
            label = class_label(name)
            flat |= {f"{label}.{key}": value for key, value in table.items() if key != "name"}
    return flat


def changed_callback_settings(
    saved: Mapping[str, Any], current: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """``LABEL.argument -> (saved, current)`` for the arguments of callbacks both runs
    added that differ (a callback added or dropped is not a change of its arguments)."""
    old, new = callback_settings(saved), callback_settings(current)
    return changed_settings(old, new, old.keys() & new.keys())


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
