"""Checkpoints in object storage, against a real S3-compatible server on 127.0.0.1
(moto in server mode): uploads verified before the bucket's ``latest`` moves, a resume
on an empty run directory from the bucket, bitwise; rotation in the bucket; a SIGKILL
during an upload; clear errors before training for a bad URL or endpoint."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from baton.callbacks import Checkpoint, CheckpointUpload
from baton.callbacks.object_store import ObjectStore
from baton.core import Driver
from baton.core.errors import UsageError
from support.processes import free_port
from support.scalar_backend import ScalarBackend

RECIPE = Path(__file__).with_name("recipe_upload.py")


def baton_run(env: dict[str, str], run_dir: Path, url: str, *flags: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "baton.core.cli.command", "run", str(RECIPE),
               "--run-dir", str(run_dir), "--url", url, *flags]  # fmt: skip
    return subprocess.Popen(
        command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


def final_state(run_dir: Path, step: int) -> bytes:
    return (run_dir / "checkpoints" / f"step_{step:06d}" / "backend" / "state.json").read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> bytes:
    """The uninterrupted run's state at step 10, with no object storage."""
    run_dir = tmp_path_factory.mktemp("reference")
    driver = Driver(ScalarBackend(lr=0.1), [Checkpoint(every_n_steps=2)], max_steps=10,
                    log_every=1, run_dir=run_dir)  # fmt: skip
    driver.fit()
    return final_state(run_dir, 10)


def test_resume_from_the_bucket_on_an_empty_run_directory_is_bitwise(s3, tmp_path, reference):
    url = f"s3://{s3.new_bucket()}/run"
    run_dir = tmp_path / "run"
    finish(baton_run(s3.env, run_dir, url, "--max-steps", "6"))
    store = ObjectStore.open(url)
    assert store.latest() == "step_000006"
    assert store.names() == ["step_000004", "step_000006"]  # keep_last=2, remotely too
    shutil.rmtree(run_dir)

    out = finish(baton_run(s3.env, run_dir, url, "--max-steps", "10", "--resume", "auto",
                           "--allow-changed", "max_steps"))  # fmt: skip
    assert "fetched checkpoint" in out and "resumed from" in out and "step 6" in out
    assert final_state(run_dir, 10) == reference
    assert store.latest() == "step_000010"
    # rotation goes on in the bucket: step 6 rotated away, and step 4, which only the
    # bucket held, with it
    assert store.names() == ["step_000008", "step_000010"]


def test_a_kill_during_an_upload_leaves_latest_on_the_previous_checkpoint(s3, tmp_path, reference):
    url = f"s3://{s3.new_bucket()}/run"
    run_dir, marker = tmp_path / "run", tmp_path / "upload-held"
    proc = baton_run(s3.env, run_dir, url, "--max-steps", "6", "--pause-at-step", "4",
                     "--marker", str(marker))  # fmt: skip
    while not marker.exists():  # the upload of step 4 wrote its first object and waits
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    proc.kill()
    proc.communicate()
    store = ObjectStore.open(url)
    assert store.latest() == "step_000002"
    assert "step_000004" in store.names()  # unfinished: objects, but no baton.json
    assert not store.fs.exists(f"{store.root}/step_000004/baton.json")

    shutil.rmtree(run_dir)
    out = finish(baton_run(s3.env, run_dir, url, "--max-steps", "10", "--resume", "auto",
                           "--allow-changed", "max_steps"))  # fmt: skip
    assert "resumed from" in out and "step 2" in out
    assert final_state(run_dir, 10) == reference
    assert store.latest() == "step_000010"


def test_rotation_deletes_in_the_bucket_and_latest_is_verified(s3, tmp_path):
    url = f"s3://{s3.new_bucket()}/run"
    upload = CheckpointUpload(url)
    driver = Driver(ScalarBackend(), [Checkpoint(every_n_steps=2, keep_last=1), upload],
                    max_steps=6, log_every=1, run_dir=tmp_path)  # fmt: skip
    driver.fit()
    assert upload.errors == []
    # a checkpoint rotated away before its turn came is not uploaded at all
    assert upload.uploaded[0] == "step_000002" and upload.uploaded[-1] == "step_000006"
    store = ObjectStore.open(url)
    assert store.names() == ["step_000006"]
    assert store.latest() == "step_000006"
    local = tmp_path / "checkpoints" / "step_000006" / "backend" / "state.json"
    assert store.fs.cat_file(f"{store.root}/step_000006/backend/state.json") == local.read_bytes()
    # no staging directories left behind
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000006"]


def test_a_fresh_run_into_a_prefix_with_checkpoints_is_refused(s3, tmp_path):
    url = f"s3://{s3.new_bucket()}/run"
    Driver(ScalarBackend(), [Checkpoint(every_n_steps=2), CheckpointUpload(url)],
           max_steps=2, run_dir=tmp_path / "a").fit()  # fmt: skip
    driver = Driver(ScalarBackend(), [CheckpointUpload(url)], max_steps=2, run_dir=tmp_path / "b")
    with pytest.raises(UsageError, match="already holds checkpoints"):
        driver.fit()
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "problem",
    ["no bucket", "unreachable endpoint", "bad URL", "missing bucket"],
)
def test_bad_storage_is_a_usage_error_before_training(s3, tmp_path, problem):
    options: dict[str, object] = {}
    url = "s3://baton-no-such-bucket/run"
    if problem == "no bucket":
        url = "s3://"
    elif problem == "unreachable endpoint":
        options = {"endpoint_url": f"http://127.0.0.1:{free_port()}"}
    elif problem == "bad URL":
        url = "nosuchprotocol://bucket/run"
    backend = ScalarBackend()
    driver = Driver(backend, [CheckpointUpload(url, storage_options=options)], max_steps=2,
                    run_dir=tmp_path / "run")  # fmt: skip
    with pytest.raises(UsageError) as raised:
        driver.fit()
    assert "setup" not in backend.events  # nothing was built
    assert not (tmp_path / "run").exists()
    assert len(str(raised.value)) < 600


def test_the_checkpoint_upload_flag_adds_the_callback_to_any_recipe(s3, tmp_path):
    from baton.core.cli.command import main

    url = f"s3://{s3.new_bucket()}/flag"
    recipe = Path(__file__).parents[1] / "safety" / "recipe_scalar.py"
    args = ["run", str(recipe), "--run-dir", str(tmp_path / "run"), "--max-steps", "4",
            "--save-every", "2", "--checkpoint-upload", url]  # fmt: skip
    assert main(args) == 0
    store = ObjectStore.open(url)
    assert store.latest() == "step_000004"
    assert store.names() == ["step_000002", "step_000004"]  # recipe_scalar keeps all


def test_a_requeued_job_on_a_machine_without_its_run_directory_resumes_from_the_bucket(
    s3, tmp_path, monkeypatch
):
    url = f"s3://{s3.new_bucket()}/requeue"
    run_dir = tmp_path / "run"
    Driver(ScalarBackend(), [Checkpoint(every_n_steps=2), CheckpointUpload(url)],
           max_steps=4, run_dir=run_dir).fit()  # fmt: skip
    shutil.rmtree(run_dir)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a requeue resumes "auto"
    driver = Driver(ScalarBackend(), [Checkpoint(every_n_steps=2), CheckpointUpload(url)],
                    max_steps=6, allow_changed="max_steps", run_dir=run_dir)  # fmt: skip
    result = driver.fit()
    assert result.resumed_from == run_dir / "checkpoints" / "step_000004"
    assert result.step == 6
