"""Registries, plugin discovery, and baton.core staying free of torch and jax."""

from __future__ import annotations

import subprocess
import sys

import pytest

from baton.core import BACKENDS, CALLBACKS, Registry, UnknownNameError


def test_unknown_name_lists_registered_names():
    with pytest.raises(
        UnknownNameError, match=r"unknown backend 'nope'; registered backends: .*fabric"
    ):
        BACKENDS.get("nope")
    with pytest.raises(UnknownNameError, match=r"registered callbacks: .*progress"):
        CALLBACKS.get("nope")


def test_registry_lazy_entries_and_conflicts():
    reg: Registry[type] = Registry("thing")
    reg.add_lazy("od", "collections:OrderedDict")
    import collections

    assert reg.get("od") is collections.OrderedDict
    reg.register("x")(int)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("x")(float)


def test_fabric_backend_is_found_by_name():
    from baton.backends.fabric.backend import FabricBackend

    assert BACKENDS.get("fabric") is FabricBackend


def test_baton_core_imports_neither_torch_nor_jax():
    code = (
        "import sys, baton.core, baton.core.cli.command, baton.core.cli.recipe, baton.callbacks;"
        "from baton.core.registry import load_plugins; load_plugins();"
        "bad = [m for m in ('torch', 'jax', 'lightning') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_listings_import_no_framework():
    code = (
        "import sys; from baton.core.cli.command import main;"
        "assert main(['backends']) == 0 and main(['patches']) == 0 and main(['callbacks']) == 0;"
        "bad = [m for m in ('torch', 'jax', 'lightning', 'megatron', 'maxtext', 'torchtitan')"
        " if m in sys.modules];"
        "assert not bad, bad"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for name in (
        "fabric",
        "lightning",
        "lightning_quiet",
        "torchtitan",
        "megatron",
        "maxtext",
        "checkpoint",
        "megatron_cpu_device",
    ):
        assert name in out.stdout
