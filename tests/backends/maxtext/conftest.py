"""MaxText tests run JAX on the CPU: pin the platform before anything starts JAX."""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="session")
def qwen3_grpo_assets(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The shared GRPO fixtures (``support.grpo``) on a tiny Qwen3 policy, built once per
    session: ``files`` and ``reference(**settings)`` (TRL's ``GRPOTrainer`` steps on the
    fixed rollouts, each setting computed once). MaxText's Llama folds the attention scale
    into its query kernel (``maxtext/hf.py``), so its gradients are not Hugging Face's;
    a Qwen3's query kernel is Hugging Face's, so gradient norms and the steps after the
    first compare with TRL's."""
    from support.grpo import grpo_assets

    return grpo_assets(tmp_path_factory.mktemp("grpo-qwen3"), family="qwen3")
