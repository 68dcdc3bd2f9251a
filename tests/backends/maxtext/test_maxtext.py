"""MaxText through baton, against MaxText's own loop (CPU, one process, one subprocess).

One baton run of ``recipes/maxtext_tiny.py`` (12 steps, an asynchronous orbax save at
step 6) is shared by the tests here, because importing MaxText and compiling its step
costs most of a minute on this machine:

* parity: MaxText's own ``train.train_loop`` on the same config and the same batches
  gives the same per-step losses. The batches reach ``train_loop`` through its data
  hook: ``setup_train_loop`` calls ``input_pipeline_interface.create_data_iterator``,
  which the test points at baton's byte stream for the duration of the call. The
  losses come out through MaxText's own ``metrics_file`` (one JSON line per step,
  written by its ``MetricLogger``).
* step numbering: MaxText names a checkpoint by the 0-based index of the step that
  wrote it, one less than the optimizer's update count; baton's step is the update
  count. A checkpoint ``train_loop`` saved is loaded into a fresh baton backend and
  training continues with MaxText's own losses.
* resume: a fresh process (the recipe, with torch made unimportable) resumes from the
  step-6 checkpoint (in the form written before baton.json recorded the backend's facts)
  and reproduces steps 7-12 exactly, without importing torch.
* the Llama 2 7B recipe's ``--dry-run`` in its own process (8 simulated devices laid
  out fsdp 4 x tensor 2),
  started first so that it overlaps with the rest.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from backends.maxtext.maxtext_support import in_background, outside_driver, record_save_handles

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "maxtext_tiny.py"
LLAMA_RECIPE = ROOT / "recipes" / "maxtext_llama2_7b.py"
STEPS = 12
MAXTEXT_DUMP_DIR = Path("/tmp/xla_dump")  # base.yml's dump_hlo_local_dir
SAVE_AT = 6


@pytest.fixture(scope="module", autouse=True)
def llama_dry_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Start ``maxtext_llama2_7b.py --dry-run`` in the background; its test collects it."""
    run_dir = tmp_path_factory.mktemp("llama_dry_run")
    command = [
        sys.executable,
        "-m",
        "baton.core.cli.command",
        "run",
        str(LLAMA_RECIPE),
        "--dry-run",
        "--world-size=8",
        "--dp-shard=4",
        "--tp=2",
        "--batch-size=8",  # per data-parallel rank: 4 per device, 32 sequences a step
        f"--run-dir={run_dir}",
    ]
    with in_background(command, run_dir) as process:
        yield process


class _Losses:
    def __init__(self) -> None:
        self.losses: dict[int, float] = {}
        self.metrics: dict[int, dict[str, float]] = {}
        self.evals: dict[int, float] = {}
        self.lazy_types: set[str] = set()


@pytest.fixture(scope="module")
def baton_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the tiny recipe for 12 steps through baton; return its losses and objects."""
    import jax

    from baton.core import Callback
    from baton.core.cli.recipe import build_driver

    run_dir = tmp_path_factory.mktemp("baton_run")
    before = {
        "env": {k: os.environ.get(k) for k in ("XLA_FLAGS", "JAX_PLATFORMS", "LIBTPU_INIT_ARGS")},
        "prng": jax.config.jax_default_prng_impl,
        "cache": jax.config.jax_compilation_cache_dir,
        "handlers": list(logging.getLogger().handlers),
        "dumped": set(MAXTEXT_DUMP_DIR.glob("*")) if MAXTEXT_DUMP_DIR.is_dir() else set(),
    }
    record = _Losses()

    class Record(Callback):
        def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
            record.losses[driver.step] = metrics["loss"]
            record.metrics[driver.step] = dict(metrics)

        def on_eval_end(self, driver: Any, metrics: dict[str, float]) -> None:
            record.evals[driver.step] = metrics["eval/loss"]

        def on_step_end(self, driver: Any, output: Any) -> None:
            if driver.step == 1:  # values stay on the device until a log step
                record.lazy_types = {
                    type(output.loss).__name__,
                    type(output.metrics["grad_norm"]).__name__,
                }

    argv = [
        f"--max-steps={STEPS}",
        "--log-every=1",
        f"--save-every={SAVE_AT}",
        f"--eval-every={SAVE_AT}",
        "--no-progress",
        "--no-print-loss",
        f"--run-dir={run_dir}",
    ]
    driver = build_driver(RECIPE, argv)
    driver.callbacks.append(Record())
    handles = record_save_handles(driver.backend)
    result = driver.fit()
    return {
        "save_handles": handles,
        "driver": driver,
        "result": result,
        "losses": record.losses,
        "metrics": record.metrics,
        "evals": record.evals,
        "lazy_types": record.lazy_types,
        "run_dir": run_dir,
        "before": before,
    }


def test_baton_run_trains_and_saves(baton_run: dict[str, Any]) -> None:
    result, losses = baton_run["result"], baton_run["losses"]
    assert result.step == STEPS
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1] - 1.0, losses  # real text: the loss falls
    first = baton_run["metrics"][1]
    assert {"grad_norm", "grad_norm_clipped", "lr", "param_norm"} <= set(first)
    # grad_norm is measured before clipping, as on every backend (MaxText's raw_grad_norm)
    assert "raw_grad_norm" not in first
    assert first["grad_norm_clipped"] <= first["grad_norm"] + 1e-6
    assert first["grad_norm"] > 1.0 >= first["grad_norm_clipped"] - 1e-6  # clipped at 1.0
    assert baton_run["lazy_types"] == {"ArrayImpl"}  # jax arrays, not host floats
    evals = baton_run["evals"]
    assert sorted(evals) == [SAVE_AT, STEPS] and evals[STEPS] < evals[SAVE_AT]
    backend = baton_run["driver"].backend
    assert backend.flops_per_token is not None and backend.flops_per_token > 0
    names = [p.name for p in result.checkpoints]
    assert names == [f"step_{SAVE_AT:06d}", f"step_{STEPS:06d}"]
    data = json.loads((result.checkpoints[0] / "backend" / "data.json").read_text())
    assert data["consumed"] == SAVE_AT
    baton_meta = json.loads((result.checkpoints[0] / "baton.json").read_text())
    assert baton_meta["step"] == SAVE_AT
    # MaxText's checkpoint layout: <root>/<name>/items, off by one: 6 updates, which
    # MaxText would have named checkpoint 5
    assert any(f.startswith(f"checkpoint/{SAVE_AT - 1}/items") for f in baton_meta["files"])
    record = baton_meta["checkpoint"]
    assert record["layout"] == {"mesh": {}, "devices": 1, "processes": 1, "scan_layers": True}
    assert record["samples"] == SAVE_AT * backend.hparams.global_batch_size_to_train_on
    assert record["data"]  # the byte corpus's fingerprint
    # on CPU the asynchronous save ran whole on the writer thread, and the step after it
    # did not donate the arrays it was writing (the parity and resume tests check the
    # losses and the saved state)
    assert baton_run["save_handles"] == ["FuturePendingSave", "FuturePendingSave"]


def test_patches_restore_the_process(baton_run: dict[str, Any]) -> None:
    import jax

    before = baton_run["before"]
    names = {d.name: d.applied for d in baton_run["driver"].patch_report}
    assert names["maxtext_no_hlo_dump"] == (not before["env"]["XLA_FLAGS"])
    assert names["maxtext_jax_settings"] and names["maxtext_root_logger"]
    assert {k: os.environ.get(k) for k in before["env"]} == before["env"]
    assert jax.config.jax_default_prng_impl == before["prng"]  # MaxText sets unsafe_rbg
    assert jax.config.jax_compilation_cache_dir == before["cache"]
    assert logging.getLogger().handlers == before["handlers"]
    assert (baton_run["run_dir"] / "jax_cache").is_dir()  # the cache stayed in the run


def _maxtext_train_loop(config: Any, workdir: Path, cache: Path) -> tuple[dict[int, float], Path]:
    """MaxText's own loop on ``config`` and baton's batches; losses by 0-based index.

    ``cache`` is the baton run's compilation cache (a compile-time saving only).
    """
    from maxtext.input_pipeline import input_pipeline_interface
    from maxtext.trainers.pre_train import train

    from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus

    metrics_file = workdir / "metrics.jsonl"
    argv = config.argv(
        {
            "run_name": "reference",
            "base_output_directory": str(workdir),
            "jax_cache_dir": str(cache),
            "metrics_file": str(metrics_file),
            "enable_checkpointing": True,
            "async_checkpointing": False,
            "checkpoint_period": 5,
        }
    )
    real_factory = input_pipeline_interface.create_data_iterator

    def baton_batches(cfg: Any, mesh: Any) -> tuple[TextBatches, None]:
        corpus = TextCorpus.load(config.data_path)
        stream = TextBatches(
            corpus.train,
            batch_size=int(cfg.global_batch_size_to_load),
            seq_len=int(cfg.max_target_length),
            seed=config.data_seed,
        )
        return stream, None

    try:
        input_pipeline_interface.create_data_iterator = baton_batches
        hparams, recorder = train.initialize(argv)
        train.train_loop(hparams, recorder)
    finally:
        input_pipeline_interface.create_data_iterator = real_factory
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    losses = {int(row["step"]): row["learning/loss"] for row in rows}
    return losses, workdir / "reference" / "checkpoints"


@pytest.fixture(scope="module")
def maxtext_reference(
    baton_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    config = baton_run["driver"].backend.config
    with outside_driver(config):
        losses, checkpoints = _maxtext_train_loop(
            config, tmp_path_factory.mktemp("maxtext_ref"), baton_run["run_dir"] / "jax_cache"
        )
    return {"losses": losses, "checkpoints": checkpoints, "config": config}


def test_losses_equal_maxtext_train_loop(
    baton_run: dict[str, Any], maxtext_reference: dict[str, Any]
) -> None:
    reference = maxtext_reference["losses"]
    assert sorted(reference) == list(range(STEPS))  # MaxText counts steps from 0
    baton = baton_run["losses"]
    mine = [baton[index + 1] for index in range(STEPS)]
    theirs = [reference[index] for index in range(STEPS)]
    assert mine == theirs


def test_continue_from_maxtext_checkpoint(
    baton_run: dict[str, Any], maxtext_reference: dict[str, Any], tmp_path: Path
) -> None:
    """MaxText's checkpoint '5' holds 6 updates: baton continues at step 7 on MaxText's losses."""
    from baton.backends.maxtext.backend import MaxTextBackend
    from baton.backends.maxtext.checkpoint import baton_step_of_maxtext_checkpoint

    checkpoints = maxtext_reference["checkpoints"]
    names = sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    assert 5 in names, names
    # outside a Driver no patch runs: keep MaxText's outputs and cache out of $HOME
    config = copy.deepcopy(maxtext_reference["config"])
    config["jax_cache_dir"] = str(baton_run["run_dir"] / "jax_cache")
    config["base_output_directory"] = str(tmp_path)
    backend = MaxTextBackend(config)
    with outside_driver():
        backend.setup()
        try:
            start = backend.restore_maxtext_checkpoint(checkpoints / "5")
            assert start == baton_step_of_maxtext_checkpoint(5) == 6
            assert backend.optimizer_step() == 6
            outputs = [backend.train_step(step).loss for step in range(start + 1, STEPS + 1)]
            losses = list(backend.fetch({str(i): v for i, v in enumerate(outputs)}).values())
        finally:
            backend.teardown()
    reference = maxtext_reference["losses"]
    assert losses == [reference[index] for index in range(start, STEPS)]


def as_written_before_the_record(source: Path, checkpoint: Path) -> None:
    """A copy of ``source`` as main wrote it before ``baton.json`` recorded the backend's
    facts: they and the data position in ``backend/baton_maxtext.json``."""
    shutil.copytree(source, checkpoint)
    meta = json.loads((checkpoint / "baton.json").read_text())
    record = meta.pop("checkpoint")
    data_file = checkpoint / "backend" / "data.json"
    side = {"format": "maxtext-orbax-v2", "optimizer_step": SAVE_AT,
            "maxtext_checkpoint_name": SAVE_AT - 1, "data": json.loads(data_file.read_text()),
            "data_fingerprint": record["data"], "layout": record["layout"]}  # fmt: skip
    (checkpoint / "backend" / "baton_maxtext.json").write_text(json.dumps(side))
    data_file.unlink()
    meta["files"].pop("data.json")
    (checkpoint / "baton.json").write_text(json.dumps(meta))


def test_resume_in_fresh_process_without_torch(baton_run: dict[str, Any], tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoints" / f"step_{SAVE_AT:06d}"
    as_written_before_the_record(baton_run["result"].checkpoints[0], checkpoint)
    out = tmp_path / "resumed.json"
    command = [
        sys.executable,
        str(Path(__file__).with_name("run_recipe.py")),
        str(out),
        str(RECIPE),
        f"--max-steps={STEPS}",
        "--log-every=1",
        "--save-every=0",
        "--no-callback=checkpoint",
        "--no-progress",
        "--no-print-loss",
        f"--run-dir={tmp_path / 'resumed'}",
        f"--resume={checkpoint}",
        # the first run's compilation cache: saves the compile, changes no number
        f"--overrides=jax_cache_dir={baton_run['run_dir'] / 'jax_cache'}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["resumed_from"] == str(checkpoint)
    assert report["torch_modules"] == []  # a MaxText run never needed torch
    assert report["jax_loaded"]
    resumed = {int(k): v for k, v in report["losses"].items()}
    assert sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1))
    assert resumed == {s: baton_run["losses"][s] for s in resumed}


def test_llama2_7b_dry_run_prints_the_mesh(llama_dry_run: subprocess.Popen[str]) -> None:
    stdout, stderr = llama_dry_run.communicate(timeout=600)
    assert llama_dry_run.returncode == 0, stderr[-4000:]
    assert "mesh         fsdp=4  tensor=2" in stdout, stdout  # the layout flags, validated
    assert "parameters   6,738,415,616" in stdout  # MaxText's Llama 2 7B
    assert "32 x 4096 tokens per step" in stdout
    assert "8 x cpu (gpu config)" in stdout


def test_pending_save_reports_checkpointer_completion(tmp_path: Path) -> None:
    """The PendingSave over MaxText's asynchronous checkpointer: done once committed."""
    import jax.numpy as jnp
    from maxtext.common import checkpointing

    from baton.backends.maxtext.checkpoint import CheckpointerPendingSave

    checkpointer = checkpointing.create_orbax_checkpoint_manager(str(tmp_path), True, True, 1)
    tree = {"w": jnp.arange(1024.0), "b": jnp.ones(8)}
    assert checkpointing.save_checkpoint(checkpointer, 3, tree, force=True)  # async
    pending = CheckpointerPendingSave(checkpointer)
    pending.wait()
    assert pending.done() and (tmp_path / "3" / "items").is_dir()
    assert not any(p.name.endswith("tmp") for p in tmp_path.rglob("*"))  # committed


def test_weights_only_start_gives_the_source_models_loss(
    baton_run: dict[str, Any], tmp_path: Path
) -> None:
    """load_parameters_path from the step-6 checkpoint: fresh optimizer at step 0, and the
    first loss on the batch the source run saw at step 7 is the source run's step-7 loss."""
    from baton.backends.maxtext.backend import MaxTextBackend
    from baton.backends.maxtext.checkpoint import params_path

    checkpoint = baton_run["result"].checkpoints[0]
    config = copy.deepcopy(baton_run["driver"].backend.config)
    config["load_parameters_path"] = str(params_path(checkpoint))
    config["jax_cache_dir"] = str(baton_run["run_dir"] / "jax_cache")
    config["base_output_directory"] = str(tmp_path)
    backend = MaxTextBackend(config)
    with outside_driver():
        backend.setup()
        try:
            assert backend.optimizer_step() == 0  # weights only: a fresh optimizer
            assert backend.batches is not None
            backend.batches.skip_to(SAVE_AT)  # the batch the source model saw next
            loss = backend.fetch({"loss": backend.train_step(1).loss})["loss"]
        finally:
            backend.teardown()
    assert loss == baton_run["losses"][SAVE_AT + 1]


def test_no_hlo_dump_was_written(
    baton_run: dict[str, Any], maxtext_reference: dict[str, Any]
) -> None:
    """Nothing was added to MaxText's default dump folder by the runs in this module."""
    before = baton_run["before"]
    assert os.environ.get("XLA_FLAGS") == before["env"]["XLA_FLAGS"]
    now = set(MAXTEXT_DUMP_DIR.glob("*")) if MAXTEXT_DUMP_DIR.is_dir() else set()
    assert now <= before["dumped"], sorted(now - before["dumped"])[:5]


def test_frozen_grain_state_is_what_grains_own_save_writes() -> None:
    """A Grain iterator's position taken at save time: the text MaxText's checkpointable
    writes for it is Grain's own JSON of the iterator at that moment, and restores there."""
    import grain
    from maxtext.common.grain_utility import _state_to_text

    from baton.backends.maxtext.background_save import FrozenIteratorState, frozen_iterator

    def at(position: int) -> Any:
        iterator = iter(grain.MapDataset.range(100).shuffle(seed=3).to_iter_dataset())
        for _ in range(position):
            next(iterator)
        return iterator

    iterator = at(7)
    frozen = frozen_iterator(iterator, expansion_factor_real_data=1)
    assert isinstance(frozen, FrozenIteratorState)
    expected_next = [next(iterator) for _ in range(5)]  # training goes on after the save
    assert _state_to_text(frozen) == json.dumps(at(7).get_state(), indent=4)
    restored = at(0)
    restored.set_state(json.loads(_state_to_text(frozen)))
    assert [next(restored) for _ in range(5)] == expected_next
    with pytest.raises(NotImplementedError):  # several iterators: orbax's own async save
        frozen_iterator([iterator, iterator], expansion_factor_real_data=1)
