"""MaxText checkpoints in baton: where they live, MaxText's step names, opening MaxText's
orbax checkpointer, restoring onto this run's shardings, refusing layouts orbax cannot
map, and the handle of orbax's own asynchronous save.

Layout of a baton MaxText checkpoint: ``<dir>/checkpoint/<name>/items`` (and ``iter``
for Grain) is a MaxText checkpoint directory; ``<dir>/data.json`` holds the data
position of baton's streams (MaxText's Grain iterator keeps its own in ``iter``). The
layout, samples consumed and the data's fingerprint are core's record in
``baton.json``; checkpoints written before kept them, with the data position, in
``<dir>/baton_maxtext.json`` (``read_legacy_meta``).

Example::

    params_path("runs/x/checkpoints/step_000050")   # .../checkpoint/49/items
    maxtext_checkpoint_name(50)                      # 49
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from baton.backends.async_save import SaveHandle
from baton.core.checkpoints.files import BACKEND_DIR

STATE_DIR = "checkpoint"
#: the data position of a baton stream, as ``data.json`` beside the state
DATA_FILE = "data.json"
#: the side file of checkpoints written before ``baton.json`` recorded their facts
LEGACY_META_FILE = "baton_maxtext.json"


def maxtext_checkpoint_name(baton_step: int) -> int:
    """The step MaxText names a checkpoint with after ``baton_step`` optimizer updates."""
    return baton_step - 1


def baton_step_of_maxtext_checkpoint(name: int) -> int:
    """The number of optimizer updates in MaxText's checkpoint ``<checkpoint_dir>/<name>``."""
    return name + 1


def params_path(checkpoint: str | Path) -> Path:
    """The orbax ``items`` directory MaxText's ``load_parameters_path`` reads (weights only).

    ``checkpoint`` is a baton checkpoint (``runs/x/checkpoints/step_000050``), its
    ``backend`` part, a MaxText step directory (``.../checkpoints/5``) or its ``items``.
    """
    checkpoint = Path(checkpoint).resolve()
    for base in (checkpoint / BACKEND_DIR, checkpoint):
        if (base / STATE_DIR).is_dir():
            return base / STATE_DIR / str(saved_name(base)) / "items"
    if checkpoint.name == "items" and checkpoint.is_dir():
        return checkpoint
    if (checkpoint / "items").is_dir():
        return checkpoint / "items"
    raise FileNotFoundError(
        f"{checkpoint} is neither a baton MaxText checkpoint (backend/{STATE_DIR}/) nor a "
        "MaxText checkpoint step directory (with items/); pass one of those"
    )


def saved_name(directory: Path) -> int:
    """The MaxText name of the one step saved under ``directory/checkpoint``."""
    names = [p.name for p in (directory / STATE_DIR).iterdir() if p.name.isdigit()]
    if len(names) != 1:
        raise FileNotFoundError(
            f"{directory / STATE_DIR} holds {len(names)} MaxText steps ({sorted(names)}), "
            "expected the one baton saved: not a baton MaxText checkpoint"
        )
    return int(names[0])


def dataset_type(hparams: Any) -> str:
    """MaxText's ``dataset_type`` as text: synthetic (baton's bytes), grain or hf."""
    value = hparams.dataset_type
    return str(getattr(value, "value", value))


class CheckpointerPendingSave(SaveHandle):
    """An asynchronous save in flight on a MaxText (orbax) checkpointer.

    ``done`` turns true once the checkpointer has no save in progress (finished or
    failed); ``wait`` then returns, or raises the background write's error, and closes
    the checkpointer (the driver renames the directory after ``wait``).
    """

    def __init__(self, checkpointer: Any) -> None:
        self._checkpointer = checkpointer

    def _poll(self) -> bool:
        return not self._checkpointer.is_saving_in_progress()

    def _join(self) -> None:
        try:
            self._checkpointer.wait()  # raises if the background write failed
        finally:
            self._checkpointer.close()


def open_checkpointer(hparams: Any, root: Path, asynchronous: bool = False) -> Any:
    """MaxText's orbax checkpointer over ``root`` (its settings from this run's config)."""
    from maxtext.common import checkpointing

    cfg = hparams
    return checkpointing.create_orbax_checkpoint_manager(
        str(root),
        True,
        asynchronous,
        1,
        use_ocdbt=cfg.checkpoint_storage_use_ocdbt,
        use_zarr3=cfg.checkpoint_storage_use_zarr3,
        checkpoint_storage_concurrent_gb=cfg.checkpoint_storage_concurrent_gb,
    )


def layout_refusal(saved: Mapping[str, Any], mine: Mapping[str, Any], hparams: Any) -> str | None:
    """Why orbax cannot restore a checkpoint saved on layout ``saved`` onto ``mine`` (a
    mesh change alone is fine: ``None``); ``MaxTextCheckpointIO.plan_load``'s refusal."""
    if "scan_layers" in saved and saved["scan_layers"] != mine["scan_layers"]:
        return (
            "scan_layers differs (stacked vs per-layer parameters), which orbax cannot map; "
            "resume with the saved scan_layers (the mesh itself may change)"
        )
    if (
        dataset_type(hparams) == "grain"
        and "processes" in saved
        and saved["processes"] != mine["processes"]
        and int(hparams.expansion_factor_real_data) <= 1
    ):
        return (
            "MaxText's Grain pipeline keeps one iterator state per process, which cannot be "
            f"split over another number of processes; resume on {saved['processes']} "
            "process(es), or train on baton's byte stream (no data path), whose global "
            "position resumes on any number of processes"
        )
    return None


def restore_state(hparams: Any, state: Any, data_iterator: Any, root: Path, name: int) -> None:
    """MaxText's ``load_state_if_possible`` of step ``name`` under ``root`` onto the live
    state's shardings (and the Grain iterator, if saved); ``state`` is updated in place."""
    import jax
    from flax import nnx
    from maxtext.common import checkpointing

    if not (root / str(name)).is_dir():
        raise FileNotFoundError(f"{root / str(name)} does not exist: no orbax state here")
    cfg = hparams
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    checkpointer = open_checkpointer(hparams, root)
    try:
        restored, _ = checkpointing.load_state_if_possible(
            checkpointer,
            data_iterator,
            "",
            "",
            cfg.checkpoint_storage_concurrent_gb,
            abstract,
            dataset_type=cfg.dataset_type,
            step=name,
            use_ocdbt=cfg.checkpoint_storage_use_ocdbt,
            use_zarr3=cfg.checkpoint_storage_use_zarr3,
            expansion_factor_real_data=cfg.expansion_factor_real_data,
            maxtext_config=cfg,
        )
    finally:
        checkpointer.close()
    overlay = restored["items"]
    pure = overlay.to_pure_dict() if hasattr(overlay, "to_pure_dict") else overlay
    nnx.replace_by_pure_dict(state, pure)


def read_legacy_meta(directory: Path) -> dict[str, Any] | None:
    """``<directory>/baton_maxtext.json`` of a checkpoint written before ``baton.json``
    recorded its facts (``None`` for a newer one); an earlier baton layout is refused
    with what to do instead."""
    meta_path = directory / LEGACY_META_FILE
    if not meta_path.is_file():
        return None
    meta: dict[str, Any] = json.loads(meta_path.read_text())
    if meta.get("format") != "maxtext-orbax-v2":
        raise ValueError(
            f"{directory} has baton's earlier MaxText layout ({meta.get('layout')}, state in "
            f"{STATE_DIR}/items); start from its weights with load_parameters_path="
            f"{directory / STATE_DIR / 'items'}"
        )
    return meta
