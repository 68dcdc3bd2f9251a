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
    """A local tokenizer and corpus in ``directory``: a byte-level BPE (``VOCAB`` ids,
    trained with the ``tokenizers`` library on the Python language reference in about a
    second, saved as a Hugging Face tokenizer directory) and ``corpus.jsonl`` (one
    document per line under ``"text"``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from baton.backends.corpus import reference_documents

    documents = [doc for doc in reference_documents() if doc.strip()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    tok_dir = directory / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(tok_dir / "tokenizer.json"))
    config = {"bos_token": special[0], "eos_token": special[1], "add_bos_token": False}
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with open(directory / "corpus.jsonl", "w", encoding="utf-8") as out:
        for doc in documents:
            out.write(json.dumps({"text": doc}) + "\n")
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

    The first run resumes the step-5 checkpoint with ``checkpoint.async_mode="async"``;
    the Checkpoint callback saves step 8 in the background (the driver's PendingSave
    path) and the validator runs at step 8 through baton's eval hooks. A second run in
    the same process resumes that asynchronous checkpoint and trains steps 9-10.
    """
    from torchtitan.components.validate import Validator

    from baton.backends.torchtitan.data import dataloader_config
    from baton.callbacks import Checkpoint

    config = small_config(str(run_dir / "torchtitan"), data=data)
    config.checkpoint.async_mode = "async"
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
