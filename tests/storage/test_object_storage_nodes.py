"""Node-local run directories with checkpoints in object storage: two torchrun agents
(two "nodes" on this host, one Fabric DDP rank each) whose run directories differ, as
each node of a cluster has its own disk. Rank 0 writes every checkpoint on its node and
uploads it; on resume every node fetches the bucket's newest complete checkpoint into
its own directory, and the ranks continue bitwise as the run that was never stopped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from baton.callbacks.object_store import ObjectStore
from baton.core.checkpoints import files as ckpt
from support.processes import run_job
from support.states import assert_bitwise_equal, load_state
from support.torchrun import failure_report, torchrun_nodes

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).with_name("recipe_nodes.py")


def test_every_node_fetches_the_buckets_checkpoint_and_resumes_bitwise(s3, tmp_path):
    import baton.core.cli.command

    cli, url = Path(baton.core.cli.command.__file__), f"s3://{s3.new_bucket()}/nodes"
    run = ("run", str(RECIPE), "--run-dir", str(tmp_path), "--checkpoint-upload", url)
    torchrun_nodes(cli, *run, "--max-steps", "10", nnodes=2, nproc=1)
    node0, node1 = tmp_path / "node0" / "checkpoints", tmp_path / "node1" / "checkpoints"
    assert [p.name for p in ckpt.list_checkpoints(node0)] == ["step_000005", "step_000010"]
    assert not ckpt.list_checkpoints(node1)  # rank 0 writes the whole DDP state
    uninterrupted = load_state(node0 / "step_000010")

    # as a job whose step-10 upload was cut short: node 0 still holds step 10 on its
    # disk, node 1 has nothing, the bucket's newest complete checkpoint is step 5
    store = ObjectStore.open(url)
    store.remove("step_000010")
    store.set_latest("step_000005")
    torchrun_nodes(cli, *run, "--max-steps", "10", "--resume", "auto", nnodes=2, nproc=1)

    # node 1 fetched step 5 and both ranks resumed from it (node 0's step 10 never
    # reached the bucket); training on ended bitwise where the first run did
    assert ckpt.read_meta(node1 / "step_000005")["step"] == 5
    assert_bitwise_equal(uninterrupted, load_state(node0 / "step_000010"), "resumed on 2 nodes")
    assert store.latest() == "step_000010"


def test_ranks_whose_directories_hold_different_checkpoints_are_refused(tmp_path):
    """Without object storage, rank 0's directory holds step 5 and rank 1's nothing:
    both ranks stop before loading, naming the fix, instead of mixing states."""
    import torch

    from baton.core.cli.recipe import build_driver

    torch.set_num_threads(1)
    args = ["--run-dir", str(tmp_path), "--dir-per", "rank", "--every-n-steps", "5"]
    driver = build_driver(RECIPE, [*args, "--max-steps", "5"])  # rank 0's directory
    assert driver is not None
    driver.fit()
    assert ckpt.latest(tmp_path / "rank0" / "checkpoints") is not None

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = run_job(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", "-m", "baton.core.cli.command", "run", str(RECIPE), *args, "--max-steps", "10",
         "--resume", "auto", "--allow-changed", "max_steps"],
        env, 300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, failure_report(done.stdout, done.stderr)
    assert "planned to resume from different checkpoints (rank 0:" in out, out[-4000:]
    assert "(rank 1: no checkpoint)" in out and "--checkpoint-upload" in out, out[-4000:]
