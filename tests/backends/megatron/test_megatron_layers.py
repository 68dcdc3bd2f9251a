"""Which layers Megatron-Core builds, and the one line a GPU run without Transformer
Engine logs: ``auto`` takes the local layers on a CPU (and for packed rows), asking for
Transformer Engine's where it is not installed is refused by name, and the line that
says attention runs unfused names what to install, only where a GPU is present."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("megatron.core")

from baton.backends.megatron.build import (
    TRANSFORMER_ENGINE_PACKAGE,
    layer_choice,
    layer_spec,
    unfused_attention_line,
)
from baton.backends.megatron.config import MegatronConfig
from baton.core.errors import UsageError

TE_INSTALLED = importlib.util.find_spec("transformer_engine") is not None


def test_the_line_says_attention_runs_unfused_and_what_to_install() -> None:
    line = unfused_attention_line("local", te_installed=False, gpu=True)
    assert line is not None and "\n" not in line
    assert "attention runs unfused" in line and "local layers" in line
    assert f"pip install {TRANSFORMER_ENGINE_PACKAGE}" in line


@pytest.mark.parametrize(
    ("choice", "te_installed", "gpu"),
    [
        ("local", False, False),  # a CPU: the local layers are the expected ones
        ("local", True, True),  # installed (packed rows, or asked for): installing helps not
        ("transformer_engine", True, True),
    ],
)
def test_no_line_where_installing_changes_nothing(
    choice: str, te_installed: bool, gpu: bool
) -> None:
    assert unfused_attention_line(choice, te_installed=te_installed, gpu=gpu) is None


@pytest.mark.skipif(TE_INSTALLED, reason="Transformer Engine is installed here")
def test_transformer_engine_asked_for_but_missing_is_refused_by_name() -> None:
    config = MegatronConfig(layer_spec="transformer_engine")
    with pytest.raises(UsageError, match=r"Transformer Engine is not installed.*auto or local"):
        layer_choice(config)
    with pytest.raises(UsageError, match="transformer-engine"):
        layer_spec(config)


def test_auto_and_local_resolve_to_the_local_layers_on_a_cpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: auto may take Transformer Engine's layers")
    assert layer_choice(MegatronConfig(layer_spec="auto")) == "local"
    assert layer_choice(MegatronConfig(layer_spec="local")) == "local"
    assert unfused_attention_line("local", te_installed=TE_INSTALLED, gpu=False) is None
