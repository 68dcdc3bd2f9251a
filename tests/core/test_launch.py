"""Rank, world size and node read the same way from torchrun, SLURM and BATON_* settings."""

from __future__ import annotations

import pytest

from baton.core.launch import Launch, LaunchError, first_host, restart_count


def test_single_process_without_launcher() -> None:
    launch = Launch.from_env({})
    assert (launch.rank, launch.world_size, launch.source) == (0, 1, "single")
    assert not launch.distributed


def test_torchrun_two_nodes() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}  # fmt: skip
    launch = Launch.from_env(env)
    assert (launch.rank, launch.local_rank, launch.node_rank, launch.num_nodes) == (5, 1, 1, 2)
    assert launch.source == "torchrun" and launch.master_port == 29400


def test_torchrun_inside_slurm_wins() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "SLURM_PROCID": "0",
           "SLURM_NTASKS": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}  # fmt: skip
    assert Launch.from_env(env).source == "torchrun"


def test_slurm_srun_tasks() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_JOB_ID": "1234"}  # fmt: skip
    launch = Launch.from_env(env)
    assert (launch.rank, launch.world_size, launch.local_rank, launch.node_rank) == (3, 4, 1, 1)
    assert launch.master_addr == "gpu007" and launch.master_port == 29500 + 1234 % 1000
    assert launch.torch_env()["RANK"] == "3" and launch.local_world_size == 2


def test_explicit_settings() -> None:
    env = {"BATON_RANK": "1", "BATON_WORLD_SIZE": "2", "BATON_MASTER_ADDR": "127.0.0.1",
           "BATON_MASTER_PORT": "4000"}  # fmt: skip
    launch = Launch.from_env(env)
    assert (launch.rank, launch.source, launch.master_addr) == (1, "explicit", "127.0.0.1")


def test_processes_lightning_starts_itself() -> None:
    """Fabric(devices=2) without torchrun re-runs the command with LOCAL_RANK, WORLD_SIZE
    and NODE_RANK but no RANK: the second process is rank 1, not a second rank 0."""
    env = {"LOCAL_RANK": "1", "WORLD_SIZE": "2", "NODE_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4000"}  # fmt: skip
    launch = Launch.from_env(env)
    assert (launch.rank, launch.world_size, launch.source) == (1, 2, "lightning")
    with pytest.raises(LaunchError, match="launch with torchrun or SLURM"):
        Launch.from_env({**env, "NODE_RANK": "1"})


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside world size 2"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ],
)
def test_inconsistent_launch_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        Launch.from_env(env)


def test_explicit_launch_without_address_says_what_to_set() -> None:
    launch = Launch.from_env({"BATON_RANK": "0", "BATON_WORLD_SIZE": "2"})
    with pytest.raises(LaunchError, match="MASTER_ADDR"):
        launch.torch_env()


@pytest.mark.parametrize(
    "nodelist, host",
    [("node[003-010,012],gpu7", "node003"), ("gpu7", "gpu7"), ("a-1,b", "a-1"), ("", "")],
)
def test_first_host_of_a_slurm_nodelist(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_restart_count_reads_torchrun_and_slurm() -> None:
    assert restart_count({}) == 0
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "2"}) == 2
    assert restart_count({"SLURM_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "0"}) == 1


def test_a_restarted_job_resumes_without_being_asked(tmp_path, monkeypatch) -> None:
    from baton.core import Driver
    from support.scalar_backend import ScalarBackend

    run_dir = tmp_path / "run"
    first = Driver(ScalarBackend(), max_steps=4, run_dir=run_dir)
    first.fit()
    first.save_checkpoint("end")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = Driver(ScalarBackend(), max_steps=6, run_dir=run_dir)
    result = again.fit()
    assert result.resumed_from is not None and result.resumed_from.name == "step_000004"


def test_a_restarted_job_whose_run_dir_is_gone_refuses(tmp_path, monkeypatch) -> None:
    from baton.core import CheckpointError, Driver
    from support.scalar_backend import ScalarBackend

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(CheckpointError, match="restart 1 of the job.*is gone"):
        Driver(ScalarBackend(), max_steps=2, run_dir=tmp_path / "gone").fit()
    assert not (tmp_path / "gone").exists()
