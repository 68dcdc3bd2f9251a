"""A rank that cannot reach its rendezvous fails within the timeout, naming the endpoint."""

from __future__ import annotations

import socket
import time

import pytest

from baton.backends.torch_distributed import TorchDistributed
from baton.core.launch import LaunchError


def test_unreachable_rendezvous_names_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)  # not a torchrun launch
    monkeypatch.setenv("BATON_RANK", "1")
    monkeypatch.setenv("BATON_WORLD_SIZE", "2")
    monkeypatch.setenv("BATON_MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("BATON_MASTER_PORT", str(port))
    monkeypatch.setenv("BATON_RENDEZVOUS_TIMEOUT", "3")
    started = time.monotonic()
    with pytest.raises(LaunchError, match=f"rendezvous at 127.0.0.1:{port} within 3 s"):
        TorchDistributed().init_process_group("gloo")
    assert time.monotonic() - started < 60


def test_bad_timeout_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from baton.core.launch import rendezvous_timeout_s

    monkeypatch.setenv("BATON_RENDEZVOUS_TIMEOUT", "soon")
    with pytest.raises(LaunchError, match="BATON_RENDEZVOUS_TIMEOUT='soon'"):
        rendezvous_timeout_s()


def test_restarted_ranks_meet_in_their_own_attempts_store() -> None:
    """After an elastic restart, torchrun's shared agent store still holds the previous
    attempt's keys. A rank that reads them first must not join that attempt: here the
    previous attempt's rank 0 published a store that is gone, then one that is alive but
    carries another token; rank 1 waits for this attempt's rank 0 and both meet."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from baton.backends.torch_distributed import ATTEMPT_STORE_KEY, attempt_store
    from baton.core.launch import Launch

    wait = timedelta(seconds=30)
    agent = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent.port)}
    with socket.socket() as sock:  # the previous attempt's store: its port now closed
        sock.bind(("127.0.0.1", 0))
        gone = sock.getsockname()[1]
    key = f"{ATTEMPT_STORE_KEY}/0"  # this process's first group (both ranks are threads)
    agent.set(key, f"127.0.0.1:{gone}:old-token")
    found: dict[str, object] = {}

    def rank_1() -> None:
        store = attempt_store(Launch(rank=1, world_size=2, source="torchrun"), env, wait, 0)
        found["value"] = store.get("from rank 0")

    joiner = threading.Thread(target=rank_1)
    joiner.start()
    time.sleep(1.0)  # rank 1 is reading the stale endpoint
    alive = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    alive.set("baton/token", "another-token")  # a live store of another attempt
    agent.set(key, f"127.0.0.1:{alive.port}:another-token-not-this")
    time.sleep(1.0)
    store = attempt_store(Launch(rank=0, world_size=2, source="torchrun"), env, wait, 0)
    store.set("from rank 0", "hello")
    joiner.join(timeout=60)
    assert found.get("value") == b"hello"
