"""Shared test setup: quiet, single-threaded, deterministic."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import pytest


@pytest.fixture(scope="session")
def grpo_assets(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The GRPO fixtures every engine's tests share (``support.grpo``), built once per
    session: ``files`` (tokenizer, policy, prompts, rollouts) and ``reference(**settings)``,
    TRL's ``GRPOTrainer`` steps on the fixed rollouts, each setting computed once."""
    from support.grpo import grpo_assets as assets

    return assets(tmp_path_factory.mktemp("grpo"))
