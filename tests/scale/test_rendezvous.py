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
