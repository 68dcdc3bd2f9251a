"""The TorchTitan backend on CPU: parity with Trainer.train(), resume, patches, ranks.

One module-scoped baton run (10 steps of TorchTitan's llama3 debug model, a save at
step 5) is shared by the parity, resume and isolation tests. One fresh process
(``resumed_run``) resumes it with async DCP saves and the validator on, which the
resume, async-save and validator tests share; the two-rank test runs FSDP under
torchrun. About 4-5 minutes on 2 busy cores, most of it importing torchtitan
(~15-35 s per process).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from support.torchrun import torchrun

pytest.importorskip("torchtitan")

import torch
import torch.distributed as dist

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("titan_worker", HERE / "titan_worker.py")
assert _spec is not None and _spec.loader is not None
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

WATCHED_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_FR_BUFFER_SIZE",
    "PYTHONHASHSEED",
)


def _process_state() -> dict[str, Any]:
    import torchtitan.components.metrics as metrics
    import torchtitan.tools.utils as titan_utils

    return {
        "gc": gc.isenabled(),
        "process_group": dist.is_initialized(),
        "multithreading": torch._C._is_multithreading_enabled(),
        "env": {key: os.environ.get(key) for key in WATCHED_ENV},
        "device_type": (titan_utils.device_type, metrics.device_type),
        "set_timeout": hasattr(dist, "set_timeout"),
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer directory and a JSON Lines corpus, made locally."""
    return worker.make_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, data: Path) -> dict[str, Any]:
    """Baton drives 10 TorchTitan steps on TorchTitan's own Hugging Face data loader and
    tokenizer (local files), saving at step 5; records the process state."""
    before = _process_state()
    run_dir = tmp_path_factory.mktemp("titan") / "run"
    losses, driver = worker.baton_run(run_dir, save_at=worker.SAVE_AT, data=data)
    return {
        "losses": losses,
        "driver": driver,
        "run_dir": run_dir,
        "before": before,
        "after": _process_state(),
    }


def _reference_losses(dump_folder: Path, data: Path) -> dict[int, float]:
    """TorchTitan's own Trainer.train() on the same config; losses from its metrics path.

    A MetricsProcessor subclass (TorchTitan's Configurable protocol) records the
    ``global_avg_loss`` that ``train_step`` hands to ``metrics_processor.log``. The
    CPU patches are applied by hand, as the driver would, and undone afterwards.
    """
    from torchtitan.components.metrics import MetricsProcessor

    from baton.backends.torchtitan import patches
    from baton.core.patches import PatchRecorder

    seen: dict[int, float] = {}

    class RecordingMetrics(MetricsProcessor):
        @dataclass(kw_only=True, slots=True)
        class Config(MetricsProcessor.Config):
            pass

        def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
            seen[step] = global_avg_loss
            super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)

    config = worker.small_config(str(dump_folder), data=data)
    config.metrics = RecordingMetrics.Config(log_freq=1)
    recorder = PatchRecorder()
    driver_view = SimpleNamespace(backend=SimpleNamespace(config=config))
    for cls in (
        patches.TorchTitanPgSetTimeout,
        patches.TorchTitanCpuDevice,
        patches.TorchTitanCpuAttention,
        patches.TorchTitanRestoreProcessState,
    ):
        patch = cls()
        verdict = patch.condition(None)
        if verdict[0] if isinstance(verdict, tuple) else verdict:
            patch.apply(driver_view, recorder)
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    for key, value in env.items():
        recorder.setenv(key, value)
    try:
        trainer = config.build()
        try:
            trainer.train()
        finally:
            trainer.close()
    finally:
        assert recorder.undo() == []
    return seen


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_losses_equal_torchtitan_train_bit_for_bit(first_run, data, tmp_path):
    """Both sides read the JSON Lines corpus with TorchTitan's HuggingFaceTextDataLoader
    and the BPE tokenizer with its HuggingFaceTokenizer."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    trainer_config = first_run["driver"].backend.config
    assert isinstance(trainer_config.dataloader, HuggingFaceTextDataLoader.Config)
    assert isinstance(trainer_config.tokenizer, HuggingFaceTokenizer.Config)
    reference = _reference_losses(tmp_path / "reference", data)
    assert sorted(reference) == list(range(1, worker.STEPS + 1))
    baton = first_run["losses"]
    assert baton == reference  # exact float equality, every step
    assert baton[worker.STEPS] < baton[1] - 0.25  # and it learns (8.00 -> 7.68, seeded)


def test_torchtitan_log_cadence_untouched(first_run):
    backend = first_run["driver"].backend
    assert backend.config.metrics.log_freq == 10  # baton logged every step without it


def test_patches_undone_after_teardown(first_run):
    assert first_run["after"] == first_run["before"]
    assert first_run["after"]["gc"] is True
    assert first_run["after"]["process_group"] is False
    report = {d.name: d.applied for d in first_run["driver"].patch_report}
    assert report == {
        "torchtitan_cpu_attention": True,
        "torchtitan_cpu_device": True,
        "torchtitan_fsdp_partial_dtensor": False,  # one rank: spmd_types works
        "torchtitan_gloo_fsdp_sum_reduction": True,  # no FSDP group on gloo: nothing to do
        "torchtitan_pg_set_timeout": True,
        "torchtitan_restore_process_state": True,
    }


@pytest.fixture(scope="module")
def resumed_run(first_run, data, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fresh process resumes the step-5 checkpoint (``titan_worker.async_resume_run``):
    TorchTitan's data-loader state comes back from the checkpoint with the weights."""
    out = tmp_path_factory.mktemp("resumed") / "resumed.json"
    run_dir = str(first_run["run_dir"])
    subprocess.run(
        [sys.executable, str(HERE / "titan_worker.py"), "resume", run_dir, out, str(data)],
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    return json.loads(out.read_text())


def test_resume_in_fresh_process_continues_the_same_losses(first_run, resumed_run):
    checkpoint = first_run["run_dir"] / "checkpoints" / f"step_{worker.SAVE_AT:06d}"
    assert (checkpoint / "baton.json").is_file()
    resumed = resumed_run
    assert resumed["resumed_from"] == str(checkpoint)
    losses = {int(k): v for k, v in resumed["losses"].items()}
    expected = {k: v for k, v in first_run["losses"].items() if k > worker.SAVE_AT}
    assert losses == expected
    # the resumed run saved step 8 asynchronously (checkpoint.async_mode="async"): the
    # backend handed the driver a pending save, and resuming that checkpoint continues
    # with the same losses
    assert resumed["save_handles"] == ["DcpSave"]
    assert resumed["again_resumed_from"].endswith("step_000008")
    again = {int(k): v for k, v in resumed["again_losses"].items()}
    assert again == {k: v for k, v in first_run["losses"].items() if k > 8}


def test_torchtitan_validator_runs_in_baton_eval_hooks(resumed_run, first_run):
    """TorchTitan's validator (config.validator, local data) runs at eval_every=8."""
    evals = resumed_run["evals"]
    assert list(evals) == ["8"]
    assert set(evals["8"]) == {"eval/loss"}
    eval_loss = evals["8"]["eval/loss"]
    assert 0.0 < eval_loss < first_run["losses"][1] - 0.25  # a trained model's loss


def test_two_trainings_in_one_process_do_not_interfere(first_run, data, tmp_path):
    losses, _ = worker.baton_run(tmp_path / "again", data=data)
    assert losses == first_run["losses"]
    assert _process_state() == first_run["before"]


def test_patches_listed_by_cli(capsys, monkeypatch):
    from baton.core.cli import main

    monkeypatch.setenv("COLUMNS", "300")  # rich would shorten the names to fit

    assert main(["patches", "--backend", "torchtitan"]) == 0
    out = capsys.readouterr().out
    for name in (
        "torchtitan_cpu_device",
        "torchtitan_cpu_attention",
        "torchtitan_restore_process_state",
        "torchtitan_pg_set_timeout",
        "torchtitan_fsdp_partial_dtensor",
        "torchtitan_gloo_fsdp_sum_reduction",
    ):
        assert name in out


@pytest.mark.slow
def test_two_cpu_ranks_agree_on_loss_and_stop(tmp_path):
    torchrun(HERE / "titan_worker.py", "ranks", str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for key in ("losses", "step", "tokens", "patches"):
        assert ranks[0][key] == ranks[1][key], key
    # FSDP really shards: each rank holds about half of every parameter
    assert all(0.45 < r["local_fraction"] < 0.55 for r in ranks), ranks
    assert ranks[0]["patches"]["torchtitan_fsdp_partial_dtensor"] is True
    assert ranks[0]["patches"]["torchtitan_gloo_fsdp_sum_reduction"] is True
    assert ranks[0]["spmd_backend"] == "spmd_types"  # the patch was undone at teardown
    assert ranks[0]["losses"]["4"] < ranks[0]["losses"]["2"]  # the reduced gradients train
    assert ranks[0]["step"] == 4  # rank 0 asked at step 3; both stopped at the log step
    assert ranks[0]["stop_reason"] == "rank 0 says stop"
    assert ranks[1]["stop_reason"] == "requested on another rank"
    assert set(ranks[0]["losses"]) == {"2", "4"}
    assert ranks[0]["tokens"] == 4 * 2 * worker.BATCH * worker.SEQ_LEN


def test_8b_dry_run_plan_validates_without_gpus():
    from torchtitan.models.llama3.config_registry import llama3_8b

    from baton.backends.torchtitan.plan import parallelism_plan

    plan = parallelism_plan(llama3_8b(), world_size=8)
    assert "8.03 B parameters" in plan
    assert "dp_shard (FSDP) 8" in plan
    bad = llama3_8b()
    bad.parallelism.tensor_parallel_degree = 3
    with pytest.raises(ValueError, match="does not fit 8 ranks"):
        parallelism_plan(bad, world_size=8)


def test_8b_recipe_dry_run_validates_layouts_and_needs_data(capsys):
    """The recipe's --dry-run checks each layout against --gpus; a real run needs data."""
    from baton.core.recipe import RecipeError, build_driver

    recipe = str(HERE.parents[2] / "recipes" / "torchtitan_llama3_8b.py")
    for flags, fsdp in ((["--tp", "2", "--pp", "2"], 2), (["--tp", "2", "--gpus", "16"], 8)):
        assert build_driver(recipe, ["--dry-run", *flags]) is None
        assert f"dp_shard (FSDP) {fsdp} x cp 1 x tp 2" in capsys.readouterr().out
    assert build_driver(recipe, ["--dry-run", "--pp", "2", "--batch-size", "2"]) is None
    assert "pp 2 (ep 1), schedule 1F1B" in capsys.readouterr().out
    with pytest.raises(RecipeError, match="does not fit 8 ranks"):
        build_driver(recipe, ["--dry-run", "--tp", "3"])
    with pytest.raises(RecipeError, match="--data-path FILE.jsonl.*--tokenizer DIR"):
        build_driver(recipe, [])
