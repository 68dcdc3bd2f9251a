"""A tiny Fabric GPT whose checkpoints go to a local S3 server (moto): after the run
directory is lost, ``--resume auto`` continues from the bucket and trains the same
steps bitwise (equal losses) as the run that was never interrupted."""

from __future__ import annotations

import shutil
from pathlib import Path

from baton.callbacks.object_store import ObjectStore
from baton.callbacks.sinks.jsonl import read_jsonl

RECIPE = Path(__file__).parents[1] / "safety" / "recipe_gpt.py"


def fit(run_dir: Path, *args: str):  # -> Driver
    """``baton run tests/safety/recipe_gpt.py`` in this process; the driver after fit."""
    import torch

    from baton.core.cli.recipe import build_driver

    torch.set_num_threads(1)
    driver = build_driver(RECIPE, ["--run-dir", str(run_dir), *args])
    assert driver is not None
    driver.fit()
    return driver


def logged_losses(run_dir: Path) -> dict[int, float]:
    rows = read_jsonl(run_dir / "logs" / "metrics.jsonl")
    return {int(row["step"]): row["loss"] for row in rows if "loss" in row}


def test_a_gpt_resumed_from_the_bucket_trains_bitwise_as_the_uninterrupted_run(s3, tmp_path):
    url = f"s3://{s3.new_bucket()}/gpt"
    run_dir = tmp_path / "run"
    fit(run_dir, "--max-steps", "12", "--checkpoint-upload", url)
    uninterrupted = logged_losses(run_dir)
    store = ObjectStore.open(url)
    assert store.names() == ["step_000006", "step_000012"]
    # as a run whose machine was lost before the step-12 upload was verified
    store.remove("step_000012")
    store.set_latest("step_000006")
    shutil.rmtree(run_dir)

    driver = fit(run_dir, "--max-steps", "12", "--resume", "auto", "--checkpoint-upload", url)
    assert driver.resumed_from == run_dir / "checkpoints" / "step_000006"
    resumed = logged_losses(run_dir)
    assert sorted(resumed) == list(range(7, 13))
    assert resumed == {step: uninterrupted[step] for step in range(7, 13)}
    assert store.latest() == "step_000012"
