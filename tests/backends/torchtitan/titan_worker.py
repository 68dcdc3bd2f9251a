"""Runs of the TorchTitan backend shared by the tests, in-process or as a script.

python titan_worker.py resume RUN_DIR OUT.json DATA_DIR   # resume RUN_DIR (async saves, eval)
torchrun --nproc-per-node 2 titan_worker.py ranks OUT_DIR   # FSDP over 2 CPU ranks
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from baton.backends.torchtitan import TorchTitanBackend
from baton.backends.torchtitan.configs import llama3_debug
from baton.core import Callback, Driver

STEPS = 10
SAVE_AT = 5
SEQ_LEN = 64
BATCH = 2
#: the test tokenizer's vocabulary (the debug model has 2048 rows)
VOCAB = 1024


def make_data(directory: Path) -> Path:
    """A local tokenizer and corpus in ``directory``: ``tokenizer/``, a byte-level BPE of
    ``VOCAB`` ids trained on the Python language reference (``baton data tokenizer``'s
    ``train_tokenizer``, about a second), ``corpus.jsonl`` (one document per line under
    ``"text"``) and ``corpus.bin``/``.idx``, the same corpus prepared with that tokenizer
    (``baton data prepare``)."""
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    tokenizer = train_tokenizer(directory / "tokenizer", vocab_size=VOCAB)
    with open(directory / "corpus.jsonl", "w", encoding="utf-8") as out:
        for doc in reference_documents():
            if doc.strip():
                out.write(json.dumps({"text": doc}) + "\n")
    prepare([directory / "corpus.jsonl"], tokenizer, directory / "corpus", workers=1)
    return directory


def small_config(dump_folder: str, steps: int = STEPS, data: Path | None = None) -> Any:
    """The debug model, small batches: on ``data`` (``make_data``: TorchTitan's Hugging
    Face loader and tokenizer) or, without it, on bytes of the language reference."""
    return llama3_debug(
        steps=steps,
        seq_len=SEQ_LEN,
        local_batch_size=BATCH,
        seed=0,
        dump_folder=dump_folder,
        dataset_path=None if data is None else str(data / "corpus.jsonl"),
        tokenizer=None if data is None else str(data / "tokenizer"),
    )


def reference_losses(config: Any) -> dict[int, float]:
    """TorchTitan's own ``Trainer.train()`` on ``config``; its losses from its metrics path.

    A MetricsProcessor subclass (TorchTitan's Configurable protocol) records the
    ``global_avg_loss`` that ``train_step`` hands to ``metrics_processor.log`` on this
    rank (under pipeline parallelism only the last stage's rank has the real loss). The
    registered TorchTitan patches whose condition holds are applied as the driver would
    (configure phase before the build, setup phase after it) and undone afterwards. A
    process that no launcher started gets the variables of a one-rank launch.
    """
    from dataclasses import dataclass
    from types import SimpleNamespace

    import torch.distributed as dist
    from torchtitan.components.metrics import MetricsProcessor

    from baton.core.patches import PatchRecorder, patches_for

    seen: dict[int, float] = {}

    class RecordingMetrics(MetricsProcessor):
        @dataclass(kw_only=True, slots=True)
        class Config(MetricsProcessor.Config):
            pass

        def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
            seen[step] = global_avg_loss
            super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)

    config.metrics = RecordingMetrics.Config(log_freq=1)
    world = dist.get_world_size() if dist.is_initialized() else 1
    view = SimpleNamespace(config=config, world_size=world, trainer=None)
    driver_view = SimpleNamespace(backend=view)
    recorder = PatchRecorder()

    def apply(phase: str) -> None:
        for cls in patches_for("torchtitan"):
            patch = cls()
            verdict = patch.condition(view)
            if cls.phase == phase and (verdict[0] if isinstance(verdict, tuple) else verdict):
                patch.apply(driver_view, recorder)

    if "RANK" not in os.environ:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
        for key, value in (env | {"MASTER_PORT": str(port)}).items():
            recorder.setenv(key, value)
    try:
        apply("configure")
        trainer = config.build()
        view.trainer = trainer
        apply("setup")
        try:
            trainer.train()
        finally:
            trainer.close()
    finally:
        assert recorder.undo() == []
    return seen


class RecordLosses(Callback):
    """Keeps every logged loss by step; asks for a save at ``save_at``."""

    def __init__(self, save_at: int | None = None) -> None:
        self.losses: dict[int, float] = {}
        self.save_at = save_at

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.step == self.save_at:
            driver.control.request_save("test save", all_ranks=True)

    def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
        if "loss" in metrics:
            self.losses[driver.step] = metrics["loss"]


def baton_run(
    run_dir: Path,
    *,
    save_at: int | None = None,
    resume: str | Path = "none",
    log_every: int = 1,
    config: Any = None,
    callbacks: list[Callback] | None = None,
    eval_every: int | None = None,
    data: Path | None = None,
) -> tuple[dict[int, float], Driver]:
    record = RecordLosses(save_at)
    backend = TorchTitanBackend(config or small_config(str(run_dir / "torchtitan"), data=data))
    driver = Driver(
        backend,
        [record, *(callbacks or [])],
        max_steps=STEPS,
        log_every=log_every,
        run_dir=run_dir,
        resume=resume,
        eval_every=eval_every,
    )
    driver.fit()
    return record.losses, driver


class RecordEval(Callback):
    """Keeps the metrics every ``on_eval_end`` receives, by step."""

    def __init__(self) -> None:
        self.seen: dict[int, dict[str, float]] = {}

    def on_eval_end(self, driver: Driver, metrics: dict[str, float]) -> None:
        self.seen[driver.step] = dict(metrics)


def async_resume_run(run_dir: Path, data: Path) -> dict[str, Any]:
    """Resume RUN_DIR with async DCP saves and TorchTitan's validator, then resume again.

    The first run resumes the step-5 checkpoint with
    ``checkpoint.async_mode="async_with_pinned_mem"`` (on CPU: staged on a thread while
    step 9 runs forward and backward, written by DCP's checkpoint process); the
    Checkpoint callback saves step 8 in the background (the driver's PendingSave path) and the validator runs at step 8 through baton's eval hooks. A second run in
    the same process resumes that asynchronous checkpoint and trains steps 9-10.
    """
    from torchtitan.components.validate import Validator

    from baton.backends.torchtitan.configs import dataloader_config
    from baton.callbacks import Checkpoint

    config = small_config(str(run_dir / "torchtitan"), data=data)
    config.checkpoint.async_mode = "async_with_pinned_mem"
    validation = dataloader_config(str(data / "corpus.jsonl"), infinite=False)
    config.validator = Validator.Config(enable=True, steps=2, dataloader=validation)
    evals = RecordEval()
    checkpoint = Checkpoint(every_n_steps=8, save_on_stop=False, keep_last=None, async_save=True)
    backend = TorchTitanBackend(config)
    handles: list[str] = []
    save = backend.save

    def observed_save(directory: Path, *, asynchronous: bool = False) -> Any:
        handle = save(directory, asynchronous=asynchronous)
        handles.append(type(handle).__name__)
        return handle

    backend.save = observed_save  # type: ignore[method-assign]
    record = RecordLosses()
    driver = Driver(
        backend,
        [record, checkpoint, evals],
        max_steps=STEPS,
        log_every=1,
        run_dir=run_dir,
        resume="auto",
        eval_every=8,
    )
    driver.fit()
    saved = driver.checkpoint_dir / "step_000008"
    again, second = baton_run(run_dir, resume=saved, data=data)
    return {
        "losses": record.losses,
        "resumed_from": str(driver.resumed_from),
        "save_handles": handles,
        "evals": evals.seen,
        "again_resumed_from": str(second.resumed_from),
        "again_losses": again,
    }


class StopOnRankZero(Callback):
    """Rank 0 alone asks to stop at step 3: every rank must stop together at step 4."""

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.step == 3 and driver.backend.rank == 0:
            driver.control.request_stop("rank 0 says stop")


class RecordSharding(Callback):
    """Records which fraction of the model's parameters this rank holds (FSDP shards)."""

    def on_train_start(self, driver: Driver) -> None:
        local = total = 0
        for part in driver.backend.trainer.model_parts:
            for param in part.parameters():
                local += param.to_local().numel() if hasattr(param, "to_local") else param.numel()
                total += param.numel()
        self.fraction = local / total


def ranks_run(out_dir: Path) -> None:
    record = RecordLosses()
    sharding = RecordSharding()
    config = small_config(str(out_dir / "torchtitan"), steps=8)
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 2  # FSDP over the 2 CPU ranks (gloo)
    backend = TorchTitanBackend(config)
    driver = Driver(
        backend,
        [record, sharding, StopOnRankZero()],
        max_steps=8,
        log_every=2,
        run_dir=out_dir / "run",
    )
    result = driver.fit()
    rank = int(os.environ["RANK"])  # the process group is gone after teardown
    facts = {
        "patches": {d.name: d.applied for d in driver.patch_report},
        "spmd_backend": backend.config.parallelism.spmd_backend,  # restored by the undo
        "local_fraction": sharding.fraction,
        "losses": record.losses,
        "step": result.step,
        "stop_reason": result.stop_reason,
        "tokens": result.tokens,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "resume":
        facts = async_resume_run(Path(sys.argv[2]), Path(sys.argv[4]))
        Path(sys.argv[3]).write_text(json.dumps(facts))
    elif mode == "ranks":
        ranks_run(Path(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
