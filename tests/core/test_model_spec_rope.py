"""Llama 3.1-style ``rope_scaling`` in the model spec: read from both ``config.json``
forms (the hub's ``rope_scaling`` + ``rope_theta``, transformers 5's ``rope_parameters``),
written back, compared, and every other rotary type refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.core.errors import UsageError
from baton.core.model.spec import LlamaSpec, RopeScaling, check_same_architecture

TINY = {
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16384,
}
#: Llama 3.1 8B's config.json values, as the hub writes them
HUB_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def _write(folder: Path, **changes: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**TINY, **changes}))
    return folder


def test_hub_rope_scaling_is_read_and_written_back(tmp_path):
    spec = LlamaSpec.from_hf(_write(tmp_path, rope_theta=500000.0, rope_scaling=HUB_SCALING))
    assert spec.rope_theta == 500000.0
    assert spec.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert spec.to_hf_config()["rope_scaling"] == HUB_SCALING
    assert LlamaSpec.from_hf_dict(spec.to_hf_config()) == spec
    assert LlamaSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_what_transformers_writes_is_read_and_what_the_spec_writes_transformers_reads(tmp_path):
    """transformers 5 writes ``rope_parameters`` (theta inside, no top-level rope_theta)."""
    transformers = pytest.importorskip("transformers")
    scaling = {**HUB_SCALING, "factor": 32.0, "original_max_position_embeddings": 32}
    fields = {k: v for k, v in TINY.items() if k != "model_type"}
    config = transformers.LlamaConfig(**fields, rope_theta=500000.0, rope_scaling=scaling)
    config.save_pretrained(tmp_path / "scaled")
    spec = LlamaSpec.from_hf(tmp_path / "scaled")
    assert spec.rope_theta == 500000.0
    assert spec.rope_scaling == RopeScaling(32.0, 1.0, 4.0, 32)
    transformers.LlamaConfig(**fields, rope_theta=250000.0).save_pretrained(tmp_path / "plain")
    plain = LlamaSpec.from_hf(tmp_path / "plain")
    assert (plain.rope_theta, plain.rope_scaling) == (250000.0, None)
    _write(tmp_path / "ours", **spec.to_hf_config())
    read = transformers.AutoConfig.from_pretrained(tmp_path / "ours")
    assert read.rope_parameters == {**scaling, "rope_theta": 500000.0}


@pytest.mark.parametrize(
    ("scaling", "named"),
    [
        ({"rope_type": "yarn", "factor": 4.0}, "rope_type 'yarn' is not supported"),
        ({"type": "linear", "factor": 2.0}, "rope_type 'linear' is not supported"),
        ({"rope_type": "dynamic", "factor": 2.0}, "rope_type 'dynamic'"),
        ({"rope_type": "llama3", "factor": 8.0}, "needs low_freq_factor, high_freq_factor"),
        ({**HUB_SCALING, "high_freq_factor": 1.0}, "high_freq_factor > low_freq_factor"),
    ],
)
def test_other_rotary_types_and_broken_scaling_are_refused_by_name(tmp_path, scaling, named):
    with pytest.raises(UsageError, match=named):
        LlamaSpec.from_hf(_write(tmp_path, rope_scaling=scaling))
    with pytest.raises(UsageError, match=named):  # transformers 5's form
        LlamaSpec.from_hf(_write(tmp_path, rope_parameters={**scaling, "rope_theta": 1e4}))


def test_a_different_scaling_is_a_different_architecture(tmp_path):
    plain = LlamaSpec.from_hf(_write(tmp_path / "plain"))
    scaled = LlamaSpec.from_hf(_write(tmp_path / "scaled", rope_scaling=HUB_SCALING))
    with pytest.raises(UsageError, match="rope_scaling is None there"):
        check_same_architecture(plain.to_dict(), scaled.to_dict(), what="--init-from x")
    recorded_before_scaling = {k: v for k, v in plain.to_dict().items() if k != "rope_scaling"}
    check_same_architecture(recorded_before_scaling, plain.to_dict(), what="--resume")


def test_a_backend_that_fixes_scaling_values_names_each_one():
    scaling = RopeScaling(32.0, 1.0, 4.0, 32)
    scaling.refuse_unless({"low_freq_factor": 1.0}, backend="X")
    with pytest.raises(UsageError) as error:
        scaling.refuse_unless(
            {"factor": 8.0, "original_max_position_embeddings": 8192}, backend="X"
        )
    message = str(error.value)
    assert "factor=32.0, original_max_position_embeddings=32" in message
    assert "factor=8.0, original_max_position_embeddings=8192" in message
