"""The Megatron backend on CPU: parity with a plain Megatron-Core loop, resume in a
fresh process, two runs in one process, patches undone, two ranks under torchrun.

One module-scoped fixture trains three times in this process (baton, a plain loop
written directly against Megatron-Core, baton again); the other tests start fresh
processes. About 2-4 minutes on 2 busy cores, mostly importing torch and megatron.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from support.torchrun import torchrun

pytest.importorskip("megatron.core")

import torch
import torch.distributed as dist

STEPS = 12
SAVE_AT = 6
SEED = 1234
WORKER = Path(__file__).with_name("worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@dataclass
class Runs:
    data_dir: Path
    run_dir: Path
    first: dict[int, float] = field(default_factory=dict)
    plain: list[float] = field(default_factory=list)
    second: dict[int, float] = field(default_factory=dict)
    state_before: dict[str, Any] = field(default_factory=dict)
    state_after: dict[str, Any] = field(default_factory=dict)
    during: dict[str, Any] = field(default_factory=dict)
    patch_report: list[Any] = field(default_factory=list)


def global_state() -> dict[str, Any]:
    """What the CPU patches and the backend touch, by identity."""
    from megatron.core import parallel_state
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer import utils as tutils
    from megatron.core.utils import GlobalMemoryBuffer

    return {
        "synchronize": torch.cuda.synchronize,
        "current_stream": torch.cuda.current_stream,
        "Stream": torch.cuda.Stream,
        "stream": torch.cuda.stream,
        "empty_cache": torch.cuda.empty_cache,
        "current_device": torch.cuda.current_device,
        "function_modes": torch._C._len_torch_function_stack(),
        "rng_tracker": mrandom._CUDA_RNG_STATE_TRACKER,
        "rng_tracker_initialized": mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED,
        "get_tensor": GlobalMemoryBuffer.__dict__["get_tensor"],
        "causal_mask": tutils.get_default_causal_mask,
        "causal_mask_softmax": fused_softmax.get_default_causal_mask,
        "model_parallel": parallel_state.model_parallel_is_initialized(),
        "process_group": dist.is_initialized(),
    }


def baton_run(data_dir: Path, run_dir: Path, *, save_at: int = 0, runs: Runs | None = None):
    from baton.backends.megatron import MegatronBackend, MegatronConfig
    from baton.backends.megatron.config import tiny_transformer_config
    from baton.core import Callback, Driver

    losses: dict[int, float] = {}

    class Record(Callback):
        def on_train_start(self, driver: Driver) -> None:
            if runs is not None:
                runs.during = global_state()

        def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
            losses[driver.step] = metrics["loss"]

        def on_step_end(self, driver: Driver, output: Any) -> None:
            if driver.step == save_at:
                driver.control.request_save("test", all_ranks=True)

    config = MegatronConfig(model=tiny_transformer_config(), warmup_steps=3, decay_steps=20)
    config.data.cache_dir = str(data_dir)
    driver = Driver(
        MegatronBackend(config), [Record()], max_steps=STEPS, log_every=1, run_dir=run_dir
    )
    driver.async_save = True
    driver.fit()
    if runs is not None:
        runs.patch_report = driver.patch_report
    return losses


def plain_loop(data_dir: Path) -> list[float]:
    """The same training written directly against Megatron-Core (no baton in the loop)."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    from baton.backends.megatron import cpu
    from baton.backends.megatron.data import (
        ByteTokenizer,
        build_gpt_datasets,
        build_indexed_dataset,
    )
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    cpu.install_all(recorder)
    store = data_dir / "plain-store"
    store.unlink(missing_ok=True)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        torch.manual_seed(SEED)
        tensor_parallel.model_parallel_cuda_manual_seed(SEED)
        config = TransformerConfig(
            num_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            ffn_hidden_size=256,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=320,
            max_sequence_length=64,
            share_embeddings_and_output_weights=True,
        )
        model = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
        optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=1e-3,
                min_lr=1e-4,
                weight_decay=0.1,
                adam_beta1=0.9,
                adam_beta2=0.95,
                clip_grad=1.0,
            ),
            [model],
        )
        scheduler = OptimizerParamScheduler(
            optimizer,
            init_lr=0.0,
            max_lr=1e-3,
            min_lr=1e-4,
            lr_warmup_steps=3,
            lr_decay_steps=20,
            lr_decay_style="cosine",
            start_wd=0.1,
            end_wd=0.1,
            wd_incr_steps=1,
            wd_incr_style="constant",
        )
        prefix = build_indexed_dataset(data_dir / "text")
        train = build_gpt_datasets(
            prefix, seq_len=64, seed=SEED, split="969,30,1", tokenizer=ByteTokenizer()
        )[0]

        def batches():
            index = 0
            while True:
                samples = [train[index + i] for i in range(4)]
                index += 4
                yield {k: torch.stack([s[k] for s in samples]) for k in samples[0]}

        def loss_func(loss_mask, output):
            losses = output.float().view(-1) * loss_mask.view(-1).float()
            count = loss_mask.sum().to(torch.int)
            return losses.sum(), count, {"lm": torch.stack([losses.sum().detach(), count.float()])}

        def forward_step(iterator, model):
            b = next(iterator)
            out = model(b["tokens"], b["position_ids"], None, labels=b["labels"])
            return out, partial(loss_func, b["loss_mask"])

        data = batches()
        result = []
        for _ in range(STEPS):
            model.zero_grad_buffer()
            optimizer.zero_grad()
            reduced = get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=data,
                model=[model],
                num_microbatches=2,
                seq_length=64,
                micro_batch_size=4,
                decoder_seq_length=64,
                forward_only=False,
            )
            finalize_model_grads([model])
            ok, _, _ = optimizer.step()
            assert ok
            scheduler.step(increment=1)
            pair = torch.stack([r["lm"] for r in reduced]).sum(0)
            result.append((pair[0] / pair[1]).item())
        return result
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        recorder.undo()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("megatron")
    r = Runs(data_dir=root / "data", run_dir=root / "runs")
    r.state_before = global_state()
    r.first = baton_run(r.data_dir, r.run_dir / "tp1", save_at=SAVE_AT, runs=r)
    r.state_after = global_state()
    r.plain = plain_loop(r.data_dir)
    r.second = baton_run(r.data_dir, r.run_dir / "second")
    return r


def test_parity_with_plain_megatron_loop(runs: Runs) -> None:
    baton_losses = [runs.first[s] for s in range(1, STEPS + 1)]
    assert len(baton_losses) >= 10
    assert baton_losses == runs.plain  # bit for bit
    assert baton_losses[-1] < baton_losses[0] - 0.3  # and it learns
    assert "megatron.training" not in sys.modules


def test_two_trainings_in_one_process_do_not_interfere(runs: Runs) -> None:
    assert runs.second == runs.first


def test_patches_applied_and_leave_nothing_behind(runs: Runs) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU patches apply only without a GPU")
    applied = {d.name for d in runs.patch_report if d.applied}
    assert applied == {
        "megatron_cpu_streams",
        "megatron_cpu_device",
        "megatron_cpu_rng_tracker",
        "megatron_cpu_memory_buffer",
        "megatron_cpu_causal_mask",
        "megatron_dcp_safe_loading",
    }
    changed = {k for k in runs.state_before if runs.during[k] is not runs.state_before[k]}
    assert {"synchronize", "current_device", "rng_tracker", "get_tensor", "causal_mask"} <= changed
    assert runs.during["function_modes"] == runs.state_before["function_modes"] + 1
    assert runs.during["model_parallel"] and runs.during["process_group"]
    for key, before in runs.state_before.items():
        after = runs.state_after[key]
        assert after is before or after == before, f"{key} was left changed"


def test_resume_in_fresh_process_continues_identically(runs: Runs, tmp_path: Path) -> None:
    ckpt = runs.run_dir / "tp1" / "checkpoints" / f"step_{SAVE_AT:06d}"
    assert (ckpt / "baton.json").is_file(), "the async save did not complete"
    out = tmp_path / "resumed.json"
    subprocess.run(
        [
            *(sys.executable, str(WORKER), "--steps", str(STEPS), "--resume", "auto"),
            *("--data-dir", str(runs.data_dir), "--run-dir", str(runs.run_dir), "--out", str(out)),
        ],
        check=True,
        env=ENV,
        timeout=600,
    )
    resumed = json.loads(out.read_text())["1"]
    assert resumed["resumed_from"] == str(ckpt)
    got = {int(k): v for k, v in resumed["losses"].items()}
    assert sorted(got) == list(range(SAVE_AT + 1, STEPS + 1))
    assert got == {s: runs.first[s] for s in got}


@pytest.mark.slow
def test_torchrun_two_cpu_ranks_data_and_tensor_parallel(runs: Runs, tmp_path: Path) -> None:
    """DP=2 reproduces the single-process losses; TP=2 trains and saves (gloo)."""
    out = tmp_path / "dist.json"
    run_dir = tmp_path / "runs"
    torchrun(
        WORKER,
        *("--steps", "6", "--save-at", "6", "--tp", "1,2"),
        *("--data-dir", str(runs.data_dir), "--run-dir", str(run_dir), "--out", str(out)),
        timeout=400,
    )
    result = json.loads(out.read_text())
    dp2 = {int(k): v for k, v in result["1"]["losses"].items()}
    assert dp2 == {s: runs.first[s] for s in range(1, 7)}
    tp2 = [v for _, v in sorted((int(k), v) for k, v in result["2"]["losses"].items())]
    assert len(tp2) == 6 and tp2[-1] < tp2[0]
    for tp in ("tp1", "tp2"):
        ckpt = run_dir / tp / "checkpoints" / "step_000006"
        assert (ckpt / "baton.json").is_file()
        assert list((ckpt / "backend").glob("*.distcp")), "no sharded files written"
    shutil.rmtree(run_dir)


def test_package_import_is_cheap_and_patches_are_listed() -> None:
    code = (
        "import sys, baton.backends.megatron\n"
        "assert 'torch' not in sys.modules and 'megatron' not in sys.modules\n"
        "from baton.core.cli import main\n"
        "main(['patches', '--backend', 'megatron'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**ENV, "COLUMNS": "200"}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("megatron_cpu_rng_tracker", "megatron_cpu_device", "megatron_cpu_causal_mask"):
        assert name in proc.stdout
