"""The TorchTitan backend on CPU: parity with Trainer.train(), resume, patches, ranks,
real data, weights-only start and Hugging Face export.

One module-scoped baton run (10 steps of TorchTitan's llama3 debug model on a local JSON
Lines corpus through TorchTitan's Hugging Face loader and a BPE tokenizer trained here,
a save at step 5) is shared by the parity, resume, isolation, weights-only-start and
export tests. One fresh process (``resumed_run``) resumes it with async DCP saves and the
validator on, which the resume, async-save and validator tests share; the two-rank test
runs FSDP on bytes under torchrun. About a minute without the slow test on a quiet
machine, most of it importing torchtitan (~15-35 s per process).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.titan_model import sdpa_model
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
    """TorchTitan's own Trainer.train() on the same config (``titan_worker.reference_losses``)."""
    return worker.reference_losses(worker.small_config(str(dump_folder), data=data))


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
    assert baton[worker.STEPS] < baton[1] - 0.25  # and it learns (seeded: the same every run)


def test_torchtitan_log_cadence_untouched(first_run):
    backend = first_run["driver"].backend
    assert backend.config.metrics.log_freq == 10  # baton logged every step without it


def test_patches_undone_after_teardown(first_run):
    assert first_run["after"] == first_run["before"]
    assert first_run["after"]["gc"] is True
    assert first_run["after"]["process_group"] is False
    report = {d.name: d.applied for d in first_run["driver"].patch_report}
    assert report == {
        "torchtitan_chat_template_generation": True,
        "torchtitan_cpu_attention": True,
        "torchtitan_cpu_device": True,
        "torchtitan_dcp_safe_loading": True,
        "torchtitan_fsdp_partial_dtensor": False,  # one rank: spmd_types works
        "torchtitan_gloo_fsdp_sum_reduction": True,  # no FSDP group on gloo: nothing to do
        "torchtitan_pg_set_timeout": True,
        "torchtitan_pipeline_microbatch_step": False,  # no pipeline parallelism
        "torchtitan_quiet": True,
        "torchtitan_restore_process_state": True,
    }


@pytest.fixture(scope="module")
def resumed_run(first_run, data, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fresh process resumes the step-5 checkpoint (``titan_worker.async_resume_run``),
    written in the older form: TorchTitan's data-loader state comes back from the
    checkpoint with the weights."""
    out = tmp_path_factory.mktemp("resumed") / "resumed.json"
    run_dir = str(first_run["run_dir"])
    # the step-5 checkpoint as main wrote it before baton.json recorded the backend's
    # facts: its layout in a side file beside the DCP state
    checkpoint = first_run["run_dir"] / "checkpoints" / f"step_{worker.SAVE_AT:06d}"
    meta = json.loads((checkpoint / "baton.json").read_text())
    record = meta.pop("checkpoint")
    assert record["layout"]["world_size"] == 1 and record["samples"] > 0
    (checkpoint / "backend" / "layout.json").write_text(json.dumps(record["layout"]))
    (checkpoint / "baton.json").write_text(json.dumps(meta))
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
    # the resumed run saved step 8 asynchronously (async_mode="async_with_pinned_mem":
    # staged on a thread while step 9 ran): the backend handed the driver a pending save,
    # and resuming that checkpoint continues with the same losses (a copy taken after
    # step 9's optimizer step would not)
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
    from baton.core.cli.command import main

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
        "torchtitan_pipeline_microbatch_step",
        "torchtitan_chat_template_generation",
        "torchtitan_quiet",
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
    assert "act. ckpt    selective\n" in plan  # SelectiveAC.Config, named as a user says it
    bad = llama3_8b()
    bad.parallelism.pipeline_parallel_degree = 3
    with pytest.raises(ValueError, match="does not fit 8 ranks"):
        parallelism_plan(bad, world_size=8)


def test_8b_recipe_dry_run_validates_layouts_and_needs_data(capsys):
    """The recipe's --dry-run checks each layout against --world-size (8 by default);
    a real run needs data."""
    from baton.core.cli.recipe import build_driver
    from baton.core.errors import DataRequired, UsageError

    recipe = str(HERE.parents[2] / "recipes" / "torchtitan_llama3_8b.py")
    layouts = ((["--tp", "2", "--pp", "2"], 2), (["--tp", "2", "--world-size", "16"], 8))
    for flags, fsdp in layouts:
        assert build_driver(recipe, ["--dry-run", *flags]) is None
        assert f"dp_shard (FSDP) {fsdp} x cp 1 x tp 2" in capsys.readouterr().out
    assert build_driver(recipe, ["--dry-run", "--pp", "2", "--batch-size", "2"]) is None
    assert "pp 2 (ep 1), schedule 1F1B" in capsys.readouterr().out
    with pytest.raises(UsageError, match="does not fit 8 ranks"):
        build_driver(recipe, ["--dry-run", "--pp", "3"])
    with pytest.raises(UsageError, match="--tp 3 does not divide the model's 32 attention heads"):
        build_driver(recipe, ["--dry-run", "--tp", "3"])
    with pytest.raises(DataRequired, match="pass --data-path and --tokenizer"):
        build_driver(recipe, [])
    with pytest.raises(DataRequired, match="pass --tokenizer [(]"):
        build_driver(recipe, ["--data-path", "corpus.jsonl"])


def _titan_model(checkpoint: Path) -> Any:
    """TorchTitan's llama3 debug model (SDPA attention, as trained on CPU) with the
    checkpoint's weights, read by DCP in this process."""
    from torchtitan.models.llama3 import model_registry

    from baton.backends.torchtitan.export import dcp_folder, read_model_weights

    config = model_registry("debugmodel").model
    return sdpa_model(config, read_model_weights(dcp_folder(checkpoint)))


def _first_batch(data: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first batch a fresh run reads: TorchTitan's HF loader and tokenizer."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from baton.backends.torchtitan.configs import dataloader_config

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(data / "tokenizer"))
    loader = dataloader_config(str(data / "corpus.jsonl")).build(
        dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=worker.SEQ_LEN,
        local_batch_size=worker.BATCH,
    )  # fmt: skip
    inputs, labels = next(iter(loader))
    return inputs["input"], inputs["positions"], labels


def test_weights_only_start_first_loss_is_the_source_models(first_run, data, tmp_path):
    """TorchTitan's initial load path (model only) from baton's step-5 checkpoint: the
    first loss is the step-5 model's loss on the first batch; step and optimizer restart."""
    checkpoint = first_run["run_dir"] / "checkpoints" / f"step_{worker.SAVE_AT:06d}"
    config = worker.small_config(str(tmp_path / "torchtitan"), data=data)
    config.checkpoint.initial_load_path = str(checkpoint)  # a baton checkpoint, relative ok
    losses, driver = worker.baton_run(tmp_path / "finetune", config=config)
    tokens, positions, labels = _first_batch(data)
    with torch.no_grad():
        logits = _titan_model(checkpoint)(tokens, positions=positions)
    source = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    assert losses[1] == pytest.approx(float(source), rel=1e-5)
    assert losses[1] < first_run["losses"][1]  # trained weights, not a fresh start
    assert driver.resumed_from is None and sorted(losses) == list(range(1, worker.STEPS + 1))


def test_export_hf_loads_in_transformers_with_equal_logits(first_run, tmp_path):
    """``export_hf`` writes the checkpoint through TorchTitan's llama3 state-dict adapter;
    transformers' LlamaForCausalLM gives the same logits as TorchTitan's model."""
    from transformers import LlamaForCausalLM

    from baton.backends.torchtitan.export import ExportError, export_hf

    checkpoint = first_run["run_dir"] / "checkpoints" / f"step_{worker.SAVE_AT:06d}"
    out = export_hf(checkpoint, tmp_path / "hf")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors"]
    hf = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    tokens = torch.randint(0, worker.VOCAB, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = _titan_model(checkpoint)(tokens)
        got = hf(tokens).logits
    assert got.shape == expected.shape == (2, 48, 2048)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ExportError, match="no TorchTitan checkpoint"):
        export_hf(tmp_path, tmp_path / "nothing")
    # `baton export --format hf` takes TorchTitan checkpoints through the same adapter
    from baton.tools.export import main as export_main

    assert export_main([str(checkpoint), str(tmp_path / "cli"), "--format", "hf"]) == 0
    assert (tmp_path / "cli" / "model.safetensors").read_bytes() == (
        out / "model.safetensors"
    ).read_bytes()


def test_prepared_dataset_trains_and_resumes_exactly(data, tmp_path):
    """The corpus prepared by ``baton data prepare`` (Megatron's .bin/.idx) on TorchTitan's
    data-loader protocol: the loss falls, and a resume from step 5 (weights, optimizer and
    the loader's window position from TorchTitan's checkpoint) repeats steps 6-10."""
    from baton.backends.torchtitan.configs import dataloader_config
    from baton.backends.torchtitan.prepared import PreparedDataLoader

    def config(name: str) -> Any:
        cfg = worker.small_config(str(tmp_path / name), data=data)
        cfg.dataloader = dataloader_config(str(data / "corpus"))
        return cfg

    first = config("first")
    assert isinstance(first.dataloader, PreparedDataLoader.Config)
    losses, _ = worker.baton_run(tmp_path / "run", save_at=worker.SAVE_AT, config=first)
    assert losses[worker.STEPS] < losses[1] - 0.25
    checkpoint = tmp_path / "run" / "checkpoints" / f"step_{worker.SAVE_AT:06d}"
    resumed, driver = worker.baton_run(tmp_path / "again", resume=checkpoint, config=config("2"))
    assert driver.resumed_from == checkpoint
    assert resumed == {k: v for k, v in losses.items() if k > worker.SAVE_AT}


def test_launch_env_from_slurm_explicit_and_single_process():
    """What TorchTitan reads (LOCAL_RANK picks its device) comes from the launch: an srun
    task, BATON_* settings, or one process that nobody launched."""
    from baton.backends.torchtitan.backend import launch_env
    from baton.core.launch import Launch

    slurm = Launch.from_env(
        {"SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NNODES": "2",
         "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "42"}
    )  # fmt: skip
    env = launch_env(slurm)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("3", "1", "4")
    assert (env["MASTER_ADDR"], env["GROUP_RANK"]) == ("gpu07", "1")
    explicit = Launch.from_env(
        {"BATON_RANK": "1", "BATON_WORLD_SIZE": "2", "BATON_MASTER_ADDR": "10.0.0.1",
         "BATON_MASTER_PORT": "29400"}
    )  # fmt: skip
    assert launch_env(explicit)["MASTER_PORT"] == "29400"
    assert launch_env(Launch.from_env({})) == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
