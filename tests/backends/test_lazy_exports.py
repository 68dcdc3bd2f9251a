"""Backend packages export their classes lazily: importing one loads no framework, and a
name is imported from its submodule on first use."""

from __future__ import annotations

import json.decoder
import subprocess
import sys

import pytest

from baton.backends.lazy_exports import lazy_exports


def test_a_name_comes_from_its_submodule_and_an_unknown_one_is_refused():
    getter = lazy_exports("json", {"JSONDecoder": "decoder"})
    assert getter("JSONDecoder") is json.decoder.JSONDecoder
    with pytest.raises(AttributeError, match="module 'json' has no attribute 'scanner'"):
        getter("scanner")


def test_every_backend_package_imports_its_classes_only_when_read():
    code = """
import sys
import baton.backends.fabric as fabric, baton.backends.megatron as megatron
import baton.backends.jax, baton.backends.lightning, baton.backends.maxtext
import baton.backends.torchtitan
heavy = ("torch", "jax", "lightning", "megatron", "maxtext", "torchtitan")
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, loaded
assert not hasattr(fabric, "NoSuchName")
from baton.backends.fabric import FabricConfig
assert "baton.backends.fabric.config" in sys.modules
assert "baton.backends.fabric.backend" not in sys.modules
assert megatron.tiny_transformer_config.__module__ == "baton.backends.megatron.config"
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
