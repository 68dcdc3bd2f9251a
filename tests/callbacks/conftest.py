"""Shared helpers for the callback tests: run the tiny test recipe in-process or as
``python -m baton.core.cli.command run`` subprocesses, and compare saved weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.states import assert_bitwise_equal, load_state  # noqa: F401 (re-exported)

RECIPE = Path(__file__).with_name("recipe_tiny.py")


def cli_command(run_dir: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "baton.core.cli.command",
        "run",
        str(RECIPE),
        "--run-dir",
        str(run_dir),
        *args,
    ]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", WANDB_MODE="offline", COLUMNS="300")
    return env


def run_cli(run_dir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_command(run_dir, *args),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fit_in_process(run_dir: Path, *args: str):  # -> Driver
    """Build the test recipe as ``baton run`` would and train in this process."""
    import torch

    from baton.core.cli.recipe import build_driver

    torch.set_num_threads(1)  # as the OMP_NUM_THREADS=1 subprocesses
    driver = build_driver(RECIPE, ["--run-dir", str(run_dir), *args])
    driver.fit()
    return driver


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def tiny_driver(run_dir: Path, callbacks: list, **driver_kwargs):  # -> Driver
    """A Driver over a tiny Fabric GPT on CPU (a step takes a few ms)."""
    import torch

    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
    from baton.core import Driver

    torch.set_num_threads(1)
    config = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        accelerator="cpu",
        eval_batches=2,
    )
    driver_kwargs.setdefault("max_steps", 20)
    driver_kwargs.setdefault("log_every", 5)
    return Driver(config.backend(), callbacks, run_dir=run_dir, **driver_kwargs)


def wandb_history(run_file: Path) -> list[dict[str, str]]:
    """History rows of a W&B ``run-*.wandb`` file (a LevelDB-style log of protobuf
    ``Record``s in 32 KiB blocks after a 7-byte ``:W&B`` header)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", f"{run_file} is not a W&B datastore file"
    block, header = 32768, 7
    pos, chunks, rows = header, b"", []
    while pos + header <= len(data):
        if block - pos % block < header:  # block tail too short for a header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        pos += header
        chunks += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
                )
        elif kind == 0:
            break
    return rows
