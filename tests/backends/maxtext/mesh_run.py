"""MaxText on a mesh of 4 simulated CPU devices, in a fresh process; results as JSON.

    python mesh_run.py OUT.json WORKDIR

1. baton runs ``recipes/maxtext_tiny.py --devices 4`` with fsdp 2 x tensor 2 for 6 steps,
   saving at steps 3 and 6;
2. MaxText's own ``train_loop`` runs the same config on the same mesh and batches;
3. the step-3 checkpoint is restored onto another mesh (data 2 x fsdp 2) and onto the
   saving mesh: the two restored states are compared leaf by leaf on the host, and the
   data-parallel run trains steps 4-6;
4. a layout orbax cannot map (``scan_layers`` changed) is refused, naming both layouts;
5. ``dry_run`` (the dry-run ability) refuses a layout that does not fit the devices.

The device count is fixed when JAX starts, hence a process of its own.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # maxtext_support
RECIPE = HERE.parents[2] / "recipes" / "maxtext_tiny.py"
STEPS, SAVE_AT = 6, 3


def baton_run(work: Path) -> tuple[Any, dict[int, float], list[Path]]:
    from baton.core import Callback
    from baton.core.cli.recipe import build_driver

    losses: dict[int, float] = {}

    class Record(Callback):
        def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
            if "loss" in metrics:
                losses[driver.step] = metrics["loss"]

    argv = [
        "--devices=4",
        "--dp-shard=2",
        "--tp=2",
        "--batch-size=8",  # per data-parallel rank: 4 per device
        f"--max-steps={STEPS}",
        "--log-every=1",
        f"--save-every={SAVE_AT}",
        "--eval-every=0",
        "--no-async-save",
        "--no-progress",
        "--no-print-loss",
        f"--run-dir={work / 'baton'}",
    ]
    driver = build_driver(RECIPE, argv)
    driver.callbacks.append(Record())
    result = driver.fit()
    return driver, losses, result.checkpoints


def train_loop_losses(config: Any, work: Path) -> dict[int, float]:
    """MaxText's own loop on the same config, mesh and byte batches (by baton step)."""
    from maxtext.input_pipeline import input_pipeline_interface
    from maxtext.trainers.pre_train import train
    from maxtext_support import outside_driver

    from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus

    metrics_file = work / "reference.jsonl"
    argv = config.argv(
        {
            "run_name": "reference",
            "base_output_directory": str(work / "reference"),
            "jax_cache_dir": str(work / "baton" / "jax_cache"),
            "metrics_file": str(metrics_file),
        }
    )
    real = input_pipeline_interface.create_data_iterator

    def baton_batches(cfg: Any, mesh: Any) -> tuple[TextBatches, None]:
        corpus = TextCorpus.load(config.data_path)
        size, length = int(cfg.global_batch_size_to_load), int(cfg.max_target_length)
        return TextBatches(corpus.train, batch_size=size, seq_len=length, seed=0), None

    try:
        input_pipeline_interface.create_data_iterator = baton_batches
        with outside_driver(config):
            hparams, recorder = train.initialize(argv)
            train.train_loop(hparams, recorder)
    finally:
        input_pipeline_interface.create_data_iterator = real
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    return {int(row["step"]) + 1: row["learning/loss"] for row in rows}


def restored(config: Any, checkpoint: Path, work: Path, layout: dict[str, int]) -> Any:
    from maxtext_support import outside_driver

    from baton.backends.maxtext.backend import MaxTextBackend

    config = copy.deepcopy(config)
    config.update(layout)
    config["jax_cache_dir"] = str(work / "baton" / "jax_cache")
    config["base_output_directory"] = str(work / "restored")
    backend = MaxTextBackend(config)
    with outside_driver():
        backend.setup()
        backend.load(checkpoint / "backend")
    return backend


def host_leaves(backend: Any) -> list[np.ndarray]:
    import jax

    def to_host(leaf: Any) -> np.ndarray:
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        return np.asarray(jax.device_get(leaf))

    return [to_host(leaf) for leaf in jax.tree.leaves(backend.state)]


def main(out: str, work_dir: str) -> None:
    from maxtext_support import outside_driver

    from baton.backends.maxtext.backend import MaxTextBackend
    from baton.core.checkpoints.compatibility import record_plan
    from baton.core.checkpoints.files import CheckpointMismatch

    work = Path(work_dir)
    driver, losses, checkpoints = baton_run(work)
    config = driver.backend.config
    mesh_a = dict(json.loads((checkpoints[0] / "baton.json").read_text())["checkpoint"])
    reference = train_loop_losses(config, work)

    same = restored(config, checkpoints[0], work, {})
    other = restored(
        config,
        checkpoints[0],
        work,
        {"ici_data_parallelism": 2, "ici_fsdp_parallelism": 2, "ici_tensor_parallelism": 1},
    )
    a, b = host_leaves(same), host_leaves(other)
    same.teardown()
    equal = len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    continued = [other.train_step(step).loss for step in range(SAVE_AT + 1, STEPS + 1)]
    values = other.fetch({str(i): v for i, v in enumerate(continued)})
    other_losses = {SAVE_AT + 1 + i: values[str(i)] for i in range(len(continued))}
    # core's check of the checkpoint's record, as if it had been saved unstacked
    meta = json.loads((checkpoints[0] / "baton.json").read_text())
    meta["checkpoint"]["layout"]["scan_layers"] = False
    try:
        record_plan(other, checkpoints[0], meta)
        refused = ""
    except CheckpointMismatch as error:
        refused = str(error)
    try:
        misfit = copy.deepcopy(config)
        misfit.update({"ici_fsdp_parallelism": 3, "ici_tensor_parallelism": 1})
        misfit["base_output_directory"] = str(work / "misfit")
        with outside_driver():
            MaxTextBackend(misfit).dry_run(4)
        misfit_error = ""
    except ValueError as error:
        misfit_error = str(error)
    report = {
        "misfit": misfit_error,
        "losses": losses,
        "reference": reference,
        "saved_layout": mesh_a["layout"],
        "other_layout": other.layout(),
        "state_equal": equal,
        "leaves": len(a),
        "other_losses": other_losses,
        "optimizer_step_after_load": SAVE_AT,
        "refused": refused,
    }
    other.teardown()
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
