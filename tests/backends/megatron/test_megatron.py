"""The Megatron backend on CPU: parity with a plain Megatron-Core loop (bytes and
prepared BPE data), resume in a fresh process (also with the distributed optimizer and a
blend of prepared datasets), two runs in one process, patches undone, bad data refused,
and the parallel layouts under torchrun.

One module-scoped fixture trains in this process (baton and the plain loop of plain.py,
on bytes and on a prepared blend with a BPE tokenizer, and with the distributed
optimizer); one fresh process resumes three of those runs; the slow test launches one
torchrun with several layouts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support.torchrun import torchrun, torchrun_nodes

pytest.importorskip("megatron.core")

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from plain import Layout, plain_loop

from baton.data import parse_blend

STEPS = 12
SAVE_AT = 6
SEED = 1234
WORKER = Path(__file__).with_name("worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@dataclass
class Runs:
    data_dir: Path
    run_dir: Path
    tokenizer: str = ""
    blend: str = ""
    first: dict[int, float] = field(default_factory=dict)
    plain: list[float] = field(default_factory=list)
    second: dict[int, float] = field(default_factory=dict)
    bpe: dict[int, float] = field(default_factory=dict)
    plain_bpe: list[float] = field(default_factory=list)
    distributed_optimizer: dict[int, float] = field(default_factory=dict)
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


def prepare_data(root: Path) -> tuple[str, str]:
    """A byte-level BPE tokenizer trained offline and two prepared datasets (halves of the
    Python language reference) through ``baton data prepare``; returns (tokenizer, blend)."""
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    tokenizer = root / "tokenizer"
    train_tokenizer(tokenizer, vocab_size=512)
    documents = reference_documents()
    half = len(documents) // 2
    for name, part in (("a", documents[:half]), ("b", documents[half:])):
        source = root / f"{name}.jsonl"
        source.write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
        prepare([source], tokenizer, root / name, workers=1)
    return str(tokenizer), f"0.7 {root / 'a'} 0.3 {root / 'b'}"


def baton_run(
    data_dir: Path,
    run_dir: Path,
    *,
    save_at: int = 0,
    runs: Runs | None = None,
    bpe: bool = False,
    distributed_optimizer: bool = False,
):
    from baton.backends.megatron import MegatronBackend, MegatronConfig
    from baton.backends.megatron.config import tiny_transformer_config
    from baton.core import Callback, Driver

    losses: dict[int, float] = {}

    class Record(Callback):
        def on_train_start(self, driver: Driver) -> None:
            if runs is not None and not runs.during:
                runs.during = global_state()

        def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
            losses[driver.step] = metrics["loss"]

        def on_step_end(self, driver: Driver, output: Any) -> None:
            # two async saves: the second reuses the first's cached save plans
            if save_at and driver.step in (save_at - 3, save_at):
                driver.control.request_save("test", all_ranks=True)

    config = MegatronConfig(model=tiny_transformer_config(), warmup_steps=3, decay_steps=20)
    config.data.cache_dir = str(data_dir)
    config.ddp.use_distributed_optimizer = distributed_optimizer
    if bpe:
        assert runs is not None
        config.data.data_path, config.data.tokenizer = runs.blend, runs.tokenizer
        config.data.train_samples = STEPS * 8
    driver = Driver(
        MegatronBackend(config), [Record()], max_steps=STEPS, log_every=1, run_dir=run_dir
    )
    driver.options = driver.options.replace(async_save=True)
    driver.fit()
    if runs is not None and not runs.patch_report:
        runs.patch_report = driver.patch_report
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("megatron")
    r = Runs(data_dir=root / "data", run_dir=root / "runs")
    r.tokenizer, r.blend = prepare_data(root / "prepared")
    r.state_before = global_state()
    r.first = baton_run(r.data_dir, r.run_dir / "base", save_at=SAVE_AT, runs=r)
    r.state_after = global_state()
    r.plain = plain_loop(Layout(), STEPS, prefix=str(r.data_dir / "text"))
    r.second = baton_run(r.data_dir, r.run_dir / "second")
    r.bpe = baton_run(r.data_dir, r.run_dir / "bpe", save_at=SAVE_AT, runs=r, bpe=True)
    r.plain_bpe = plain_loop(
        Layout(bpe=True),
        STEPS,
        blend=parse_blend(r.blend).megatron(),
        tokenizer=r.tokenizer,
        train_samples=STEPS * 8,
    )
    r.distributed_optimizer = baton_run(
        r.data_dir, r.run_dir / "do", save_at=SAVE_AT, distributed_optimizer=True
    )
    return r


def test_parity_with_plain_megatron_loop(runs: Runs) -> None:
    baton_losses = [runs.first[s] for s in range(1, STEPS + 1)]
    assert len(baton_losses) >= 10
    assert baton_losses == runs.plain  # bit for bit
    assert baton_losses[-1] < baton_losses[0] - 0.3  # and it learns
    assert "megatron.training" not in sys.modules


def test_prepared_blend_with_bpe_tokenizer_trains_at_parity(runs: Runs) -> None:
    """Megatron's tokenizer and BlendedDataset over two prepared prefixes, both sides."""
    losses = [runs.bpe[s] for s in range(1, STEPS + 1)]
    assert losses == runs.plain_bpe  # bit for bit
    assert losses[-1] < losses[0] - 0.3
    assert losses != [runs.first[s] for s in range(1, STEPS + 1)]  # other tokens


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
        "megatron_quiet",
        "megatron_quiet_cpu",
    }
    changed = {k for k in runs.state_before if runs.during[k] is not runs.state_before[k]}
    assert {"synchronize", "current_device", "rng_tracker", "get_tensor", "causal_mask"} <= changed
    assert runs.during["function_modes"] == runs.state_before["function_modes"] + 1
    assert runs.during["model_parallel"] and runs.during["process_group"]
    for key, before in runs.state_before.items():
        after = runs.state_after[key]
        assert after is before or after == before, f"{key} was left changed"


def as_written_before_the_record(checkpoint: Path) -> None:
    """Move the layout of ``checkpoint``'s record back into its common state (written
    as ``common.pt``, which ``dist_checkpointing`` reads before its embedded copy)."""
    import torch
    from megatron.core import dist_checkpointing

    meta = json.loads((checkpoint / "baton.json").read_text())
    common = dist_checkpointing.load_common_state_dict(str(checkpoint / "backend"))
    common["layout"] = meta.pop("checkpoint")["layout"]
    torch.save(common, checkpoint / "backend" / "common.pt")
    (checkpoint / "baton.json").write_text(json.dumps(meta))


def test_resume_in_fresh_process_continues_identically(runs: Runs, tmp_path: Path) -> None:
    """Bytes, the prepared blend (data position included) and the distributed optimizer;
    the bytes' checkpoint in the form written before ``baton.json`` recorded the layout
    (it was in ``dist_checkpointing``'s common state)."""
    bpe = runs.run_dir / "bpe" / "checkpoints" / f"step_{SAVE_AT:06d}" / "baton.json"
    record = json.loads(bpe.read_text())["checkpoint"]
    assert record["layout"]["tensor"] == 1 and record["samples"] == SAVE_AT * 8
    assert len(record["data"]) == 16
    as_written_before_the_record(runs.run_dir / "base" / "checkpoints" / f"step_{SAVE_AT:06d}")
    out = tmp_path / "resumed.json"
    subprocess.run(
        [
            *(sys.executable, str(WORKER), "--steps", str(STEPS), "--resume", "auto"),
            *("--runs", "base,bpe,do", "--data-dir", str(runs.data_dir)),
            *("--data-path", runs.blend, "--tokenizer", runs.tokenizer),
            *("--train-samples", str(STEPS * 8)),
            *("--run-dir", str(runs.run_dir), "--out", str(out)),
        ],
        check=True,
        env=ENV,
        timeout=600,
    )
    result = json.loads(out.read_text())
    for name, first in (
        ("base", runs.first),
        ("bpe", runs.bpe),
        ("do", runs.distributed_optimizer),
    ):
        ckpt = runs.run_dir / name / "checkpoints" / f"step_{SAVE_AT:06d}"
        assert result[name]["resumed_from"] == str(ckpt), result[name]
        got = {int(k): v for k, v in result[name]["losses"].items()}
        assert sorted(got) == list(range(SAVE_AT + 1, STEPS + 1))
        assert got == {s: first[s] for s in got}, name


def test_weights_only_start_matches_source_model_on_the_same_batch(runs: Runs) -> None:
    """A run started from a checkpoint's weights (fresh optimizer, step 0) has as its first
    loss the source model's loss on that first batch (the source loaded in full, then
    evaluated forward-only on the same samples)."""
    from baton.backends.megatron import MegatronBackend, MegatronConfig
    from baton.core import Callback, Driver

    source = runs.run_dir / "base" / "checkpoints" / f"step_{SAVE_AT:06d}"
    first: dict[int, float] = {}

    class Record(Callback):
        def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
            first[driver.step] = metrics["loss"]

    config = MegatronConfig(warmup_steps=3, decay_steps=20, init_from=str(source))
    config.data.cache_dir = str(runs.data_dir)
    driver = Driver(
        MegatronBackend(config),
        [Record()],
        max_steps=1,
        log_every=1,
        run_dir=runs.run_dir / "weights-only",
    )
    result = driver.fit()
    assert result.resumed_from is None and sorted(first) == [1]

    # the source model, loaded in full, evaluated on the first batch
    from baton.backends.megatron import cpu
    from baton.backends.megatron.step import mean_loss, run_schedule
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    config = MegatronConfig(warmup_steps=3, decay_steps=20)
    config.data.cache_dir = str(runs.data_dir)
    backend = MegatronBackend(config)
    try:
        backend.setup()
        backend.load(source / "backend")
        assert backend.train_stream.consumed == SAVE_AT * 8
        for stream in backend.train_streams:
            stream.consumed = 0
        for chunk in backend.chunks:
            chunk.eval()
        with torch.no_grad():
            reduced = run_schedule(
                backend.chunks,
                backend.train_streams,
                backend.config,
                num_microbatches=2,
                forward_only=True,
            )
            reference = mean_loss(reduced, torch.device("cpu"))
    finally:
        backend.teardown()
        recorder.undo()
    assert first[1] == reference.item()
    assert first[1] < runs.first[1] - 0.1  # the trained weights, not a fresh model


def test_load_failures_name_the_call_and_a_bare_assertion_its_source_line(tmp_path: Path) -> None:
    import importlib.util

    from baton.backends.megatron.checkpoint import CheckpointLoadError
    from baton.backends.megatron.checkpoint import naming_failures as _naming_failures

    # a bare assert outside the test module (pytest rewrites asserts only in tests)
    source = tmp_path / "distrib_optimizer.py"
    source.write_text("def state_dict():\n    steps = [1, 2]\n    assert len(steps) == 1\n")
    spec = importlib.util.spec_from_file_location("distrib_optimizer", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(CheckpointLoadError) as error:
        with _naming_failures("dist_checkpointing.load(ckpt)"):
            module.state_dict()
    assert str(error.value) == (
        "dist_checkpointing.load(ckpt) failed: AssertionError at distrib_optimizer.py:3 "
        "in state_dict: assert len(steps) == 1"
    )
    with pytest.raises(CheckpointLoadError, match=r"restoring failed: KeyError: 'rng'"):
        with _naming_failures("restoring"):
            {}["rng"]


def test_bad_data_input_is_refused_before_anything_is_built(runs: Runs, tmp_path: Path) -> None:
    from baton.backends.megatron import MegatronBackend, MegatronConfig
    from baton.data import DataError, train_tokenizer

    def check(**data: Any) -> str:
        config = MegatronConfig(vocab_size=data.pop("vocab_size", None))
        for key, value in data.items():
            setattr(config.data, key, value)
        with pytest.raises(DataError) as error:
            MegatronBackend(config).check_data()
        return str(error.value)

    prefix = runs.blend.split()[1]
    message = check(data_path=prefix, tokenizer=runs.tokenizer, vocab_size=300)
    assert "512" in message and "300" in message
    other = tmp_path / "other-tokenizer"
    train_tokenizer(other, vocab_size=400)
    message = check(data_path=prefix, tokenizer=str(other))
    assert "fingerprint" in message and str(other) in message
    lone = tmp_path / "lone"
    shutil.copy(prefix + ".bin", str(lone) + ".bin")
    assert "lone" in check(data_path=str(lone), tokenizer=runs.tokenizer)
    assert "tokenizer" in check(data_path=prefix)
    assert "data path" in check(tokenizer=runs.tokenizer)

    # a .txt file prepared whole is one document: the message says how to split it
    from baton.tools.data.prepare import prepare

    text = tmp_path / "notes.txt"
    text.write_text("".join(f"Paragraph {i}: some words here.\n\n" for i in range(50)))
    prepare([text], runs.tokenizer, tmp_path / "notes", workers=1)
    message = check(data_path=str(tmp_path / "notes"), tokenizer=runs.tokenizer)
    assert "1 document(s)" in message and "--txt-split paragraph" in message
    assert "--set data.split=" in message


@pytest.mark.slow
def test_torchrun_two_ranks_layouts_parity_and_resharding(runs: Runs, tmp_path: Path) -> None:
    """One torchrun (2 gloo ranks): data parallel 2 reproduces one rank's losses; pipeline
    parallel 2 (1F1B) and the interleaved schedule, with and without the distributed
    optimizer, equal a plain Megatron-Core loop with the same layout bit for bit; tensor
    parallel 2 with the distributed optimizer equals its plain loop; checkpoints of TP 2
    and PP 2 resume as one model-parallel rank (data parallel 2), and a distributed-optimizer
    checkpoint is refused under another tensor layout with both layouts named."""
    out = tmp_path / "dist.json"
    run_dir = tmp_path / "runs"
    names = [
        "base", "tp2", "pp2", "plain-pp2", "pp2-vpp2", "plain-pp2-vpp2",
        "pp2-do", "plain-pp2-do", "pp2-vpp2-do", "plain-pp2-vpp2-do",
        "tp2-do", "plain-tp2-do", "tp2-v384",
        "v384@tp2-v384", "base@pp2", "do@tp2-do", "base@tp2",
    ]  # fmt: skip
    torchrun(
        WORKER,
        *("--steps", "4", "--save-at", "2", "--runs", ",".join(names)),
        *("--data-dir", str(runs.data_dir), "--run-dir", str(run_dir), "--out", str(out)),
        timeout=590,
    )
    result = json.loads(out.read_text())

    def losses(name: str) -> dict[int, float]:
        assert "error" not in result[name], result[name]
        return {int(k): v for k, v in result[name]["losses"].items()}

    assert losses("base") == {s: runs.first[s] for s in range(1, 5)}
    for layout in ("pp2", "pp2-vpp2", "pp2-do", "pp2-vpp2-do", "tp2-do"):
        assert losses(layout) == losses(f"plain-{layout}"), layout
    assert losses("tp2")[4] < losses("tp2")[1]
    # PP 2 -> 1: the same model and state; the logged loss agrees to the last float32 bit
    # or one unit of it (measured: step 3 bit for bit, step 4 one unit apart)
    resumed_pp = losses("base@pp2")
    assert sorted(resumed_pp) == [3, 4] and resumed_pp[3] == losses("pp2")[3]
    assert resumed_pp[4] == pytest.approx(losses("pp2")[4], rel=2e-7, abs=0)
    # TP 2 -> 1: the same model; the split matmuls may sum in another order (measured
    # here: no difference at all)
    resumed = losses("v384@tp2-v384")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == pytest.approx(losses("tp2-v384")[step], abs=1e-5)
    for source in ("tp2-v384", "pp2"):
        assert list((run_dir / source / "checkpoints" / "step_000002" / "backend").glob("*.distcp"))
    refused = result["do@tp2-do"]["error"]
    assert "checkpoint has tensor=2, pipeline=1" in refused
    assert "this run has tensor=1, pipeline=1" in refused
    assert "320" in result["base@tp2"]["error"] and "384" in result["base@tp2"]["error"]
    shutil.rmtree(run_dir)


@pytest.mark.slow
def test_torchrun_four_ranks_data_times_tensor_parallel(runs: Runs, tmp_path: Path) -> None:
    """Data parallel 2 x tensor parallel 2 (4 gloo ranks), with and without the
    distributed optimizer, equals the plain Megatron-Core loop with the same layout."""
    out = tmp_path / "dptp.json"
    torchrun(
        WORKER,
        *("--steps", "3", "--runs", "tp2,plain-tp2,tp2-do,plain-tp2-do"),
        *("--data-dir", str(runs.data_dir), "--run-dir", str(tmp_path / "runs")),
        *("--out", str(out)),
        nproc=4,
        timeout=590,
    )
    result = json.loads(out.read_text())
    for layout in ("tp2", "tp2-do"):
        assert "error" not in result[layout], result[layout]
        assert result[layout]["losses"] == result[f"plain-{layout}"]["losses"], layout
        assert len(result[layout]["losses"]) == 3


@pytest.mark.slow
def test_two_node_torchrun_data_parallel(runs: Runs, tmp_path: Path) -> None:
    """Two torchrun agents (--nnodes 2, c10d on 127.0.0.1), one rank each: node and rank
    read from the launch, one checkpoint written once, resumed on both nodes."""
    out = tmp_path / "nodes.json"
    run_dir = tmp_path / "runs"
    torchrun_nodes(
        WORKER,
        *("--steps", "4", "--save-at", "2", "--runs", "base,base@base"),
        *("--data-dir", str(runs.data_dir), "--run-dir", str(run_dir), "--out", str(out)),
        timeout=590,
    )
    result = json.loads(out.read_text())
    other = json.loads(Path(f"{out}.rank1").read_text())
    assert result["base"]["launch"] == {"rank": 0, "local_rank": 0, "node": 0}
    assert other["base"] == {"rank": 1, "local_rank": 0, "node": 1}
    assert result["base"]["world_size"] == 2
    ckpts = sorted((run_dir / "base" / "checkpoints").glob("step_*"))
    assert [p.name for p in ckpts] == ["step_000002"]
    assert len(list(ckpts[0].glob("baton.json"))) == 1
    first = {int(k): v for k, v in result["base"]["losses"].items()}
    assert first == {s: runs.first[s] for s in range(1, 5)}  # DP 2 = one rank's losses
    resumed = result["base@base"]
    assert resumed["resumed_from"] == str(ckpts[0])
    assert {int(k): v for k, v in resumed["losses"].items()} == {3: first[3], 4: first[4]}


def test_8b_recipe_validates_layouts_and_needs_data(capsys: pytest.CaptureFixture[str]) -> None:
    """``baton run --dry-run`` prints the backend's layout plan for ``--world-size`` ranks
    and refuses a layout that does not fit; a real run without data is refused by name."""
    from baton.core.cli.recipe import build_driver
    from baton.core.errors import DataRequired, UsageError

    recipe = Path(__file__).parents[3] / "recipes" / "megatron_llama3_8b.py"
    plan = ["--dry-run", "--world-size", "16", "--pp", "4"]
    assert build_driver(recipe, [*plan, "--vpp", "2"]) is None
    out = capsys.readouterr().out
    assert "world size 16 = tensor 2 x pipeline 4 x data 2" in out
    assert "2 virtual stage(s) of 4" in out
    with pytest.raises(UsageError, match="world size 12 is not divisible"):
        build_driver(recipe, ["--dry-run", "--world-size", "12", "--pp", "4"])
    with pytest.raises(
        UsageError, match="--pp 4 x --vpp 3 model chunks do not divide the model's 32 layers"
    ):
        build_driver(recipe, [*plan, "--vpp", "3"])
    with pytest.raises(DataRequired, match="pass --data-path and --tokenizer"):
        build_driver(recipe, [])


def test_package_import_is_cheap_and_patches_are_listed() -> None:
    code = (
        "import sys, baton.backends.megatron\n"
        "assert 'torch' not in sys.modules and 'megatron' not in sys.modules\n"
        "from baton.core.cli.command import main\n"
        "main(['patches', '--backend', 'megatron'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**ENV, "COLUMNS": "200"}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("megatron_cpu_rng_tracker", "megatron_cpu_device", "megatron_cpu_causal_mask"):
        assert name in proc.stdout


def test_thread_writer_writes_the_state_of_the_save_and_reraises_its_errors() -> None:
    """The thread caller copies the write buckets before the optimizer may step (the
    write sees the state of the save, not a later one) and hands the write's error to
    the training thread."""
    import threading

    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

    from baton.backends.megatron.thread_writer import ThreadAsyncCaller

    weight = torch.zeros(4)
    written: list[torch.Tensor] = []
    release = threading.Event()

    def write(rank: int, buckets: list[Any], results: Any) -> None:
        release.wait()  # the write runs after the next optimizer step
        (_file, _key, (_bytes, tensors)) = buckets[0]
        written.append(tensors[0][1].clone())

    buckets = [("file", "key", ([], [("item", weight)]))]
    caller = ThreadAsyncCaller()
    caller.schedule_async_call(AsyncRequest(write, (0, buckets, None), [], preload_fn=list))
    caller.staged.wait()  # what train_step waits for before optimizer.step()
    weight.add_(1.0)  # the optimizer's in-place update
    release.set()
    assert caller.is_current_async_call_done(blocking=True, no_dist=True)
    assert torch.equal(written[0], torch.zeros(4))

    def fail(rank: int, buckets: list[Any], results: Any) -> None:
        raise OSError("No space left on device")

    caller.schedule_async_call(AsyncRequest(fail, (0, [], None), [], preload_fn=list))
    with pytest.raises(OSError, match="No space left"):
        caller.is_current_async_call_done(blocking=True, no_dist=True)


def test_staging_buffers_are_reused_and_hold_each_saves_values() -> None:
    from types import SimpleNamespace

    from baton.backends.megatron.thread_writer import StagingBuffers

    weight, bias = torch.arange(6.0).view(2, 3), torch.ones(3)
    items = [SimpleNamespace(index=("w", 0)), SimpleNamespace(index=("b", 0))]

    def buckets() -> list[Any]:
        return [("file", "key", ([], [(items[0], weight), (items[1], bias)]))]

    buffers = StagingBuffers()
    first = buffers.stage(buckets())[0][2][1]
    weight.mul_(10)  # the optimizer steps between two saves
    second = buffers.stage(buckets())[0][2][1]
    assert second[0][1].data_ptr() == first[0][1].data_ptr()  # the same buffer, refilled
    assert torch.equal(second[0][1], torch.arange(6.0).view(2, 3) * 10)
    weight.zero_()
    assert torch.equal(second[0][1], torch.arange(6.0).view(2, 3) * 10)  # a private copy
    bigger = torch.ones(4)  # a changed item gets a fresh buffer of its shape
    third = buffers.stage([("file", "key", ([], [(items[1], bigger)]))])[0][2][1]
    assert third[0][1].shape == (4,) and torch.equal(third[0][1], bigger)


def test_device_mode_is_left_only_inside_the_pause_and_only_when_innermost() -> None:
    """``device_mode_paused`` leaves ``CudaMeansCpu`` for its block and enters it again;
    under another, inner torch function mode it changes nothing."""
    import torch
    from torch.overrides import BaseTorchFunctionMode, _get_current_function_mode

    from baton.backends.megatron.cpu import CudaMeansCpu, device_mode_paused, install_device_mode
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    install_device_mode(recorder)
    try:
        assert torch.zeros(1, device="cuda").device.type == "cpu"
        with device_mode_paused():
            assert _get_current_function_mode() is None
        assert isinstance(_get_current_function_mode(), CudaMeansCpu)
        with BaseTorchFunctionMode(), device_mode_paused():
            assert torch.zeros(1, device="cuda").device.type == "cpu"  # still under the mode
    finally:
        assert not recorder.undo()
    assert _get_current_function_mode() is None
