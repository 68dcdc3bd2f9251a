"""A real single-node SLURM cluster for tests: munged, slurmctld and slurmd from
Debian's packages (``slurm-wlm``, ``munge``), started in a temporary directory.

Example::

    with SlurmCluster(tmp_path) as cluster:
        env = cluster.env()                 # SLURM_CONF for sbatch/squeue/scontrol
        subprocess.run(["sbatch", ...], env=env)
        cluster.wait_for_state(job_id, {"COMPLETED"})

This host is the only node (2 CPUs, shared by up to four tasks); there are no cgroup
plugins (``proctrack/linuxproc``, ``task/none``), so it runs in an unprivileged
container as root. Everything lives below the given directory; ``stop`` kills the
daemons and nothing stays behind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

DAEMONS = ("munged", "slurmctld", "slurmd")


def slurm_available() -> bool:
    return all(shutil.which(d) or Path("/usr/sbin", d).exists() for d in DAEMONS)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    """munged + slurmctld + slurmd on this host, configured under ``root``."""

    def __init__(self, root: Path, cpus: int = 2) -> None:
        self.root = root
        self.cpus = cpus
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.sock"

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        for sub in ("state", "spool", "munge", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        subprocess.run(
            [_sbin("munged"), f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={self.root}/munge/munged.pid", f"--log-file={self.root}/log/munged.log",
             f"--seed-file={self.root}/munge/seed", "--force"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        self.conf.write_text(self._config())
        env = self.env()
        subprocess.run([_sbin("slurmctld"), "-i"], check=True, env=env)
        subprocess.run([_sbin("slurmd"), "-N", self.node], check=True, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True
            )
            if out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the test SLURM node never became idle; logs in {self.root}/log")

    def stop(self) -> None:
        for pid_file in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            path = self.root / pid_file
            try:
                os.kill(int(path.read_text().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                continue
        time.sleep(0.5)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- use --------------------------------------------------------------------------
    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) pointed at this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``Restarts``, ...)."""
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id],
            env=self.env(), capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_for_state(self, job_id: str, states: set[str], timeout: float = 300) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            time.sleep(1)
        raise TimeoutError(f"job {job_id} never reached {states}: {self.job(job_id)}")

    def scontrol(self, *args: str) -> None:
        subprocess.run(["scontrol", *args], env=self.env(), check=True, capture_output=True)

    def _config(self) -> str:
        root = self.root
        return f"""\
ClusterName=baton-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
MpiDefault=none
KillWait=30
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
