"""The Llama spec read from a Hugging Face config.json: fields, refusals, comparisons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.core.errors import UsageError
from baton.core.model.spec import LlamaSpec, check_same_architecture, resolve_spec

TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 4096,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def _write(folder: Path, **changes: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**TINY, **changes}))
    return folder


def test_spec_reads_every_field_and_round_trips_through_config_json(tmp_path):
    spec = LlamaSpec.from_hf(_write(tmp_path / "tiny"))
    assert spec == LlamaSpec(4096, 64, 2, 4, 2, 176, 16, 10000.0, 1e-5, False, 256)
    assert LlamaSpec.from_hf_dict(spec.to_hf_config()) == spec
    assert LlamaSpec.from_dict(spec.to_dict()) == spec
    assert LlamaSpec.from_hf(tmp_path / "tiny" / "config.json") == spec


def test_spec_reads_what_transformers_writes(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k != "architectures"})
    config.save_pretrained(tmp_path)
    spec = LlamaSpec.from_hf(tmp_path)
    assert (spec.num_kv_heads, spec.head_dim, spec.ffn_hidden_size) == (2, 16, 176)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
    ],
)
def test_unsupported_configs_are_refused_by_name(tmp_path, change, named):
    with pytest.raises(UsageError, match=named):
        LlamaSpec.from_hf(_write(tmp_path, **change))


def test_missing_config_and_missing_field_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no config.json"):
        LlamaSpec.from_hf(tmp_path / "absent")
    broken = dict(TINY)
    del broken["hidden_size"]
    with pytest.raises(UsageError, match="hidden_size"):
        LlamaSpec.from_hf_dict(broken)


def test_different_architecture_names_the_first_differing_field(tmp_path):
    a = LlamaSpec.from_hf(_write(tmp_path / "a"))
    b = LlamaSpec.from_hf(_write(tmp_path / "b", num_hidden_layers=4, hidden_size=128))
    check_same_architecture(a.to_dict(), a.to_dict(), what="x")
    check_same_architecture(None, a.to_dict(), what="x")  # a run from before specs
    with pytest.raises(UsageError, match="hidden_size is 128 there, 64 here"):
        check_same_architecture(b.to_dict(), a.to_dict(), what="checkpoint c")
    with pytest.raises(UsageError, match="num_layers"):
        resolve_spec(str(tmp_path / "a"), str(_write(tmp_path / "c", num_hidden_layers=4)))
    assert resolve_spec(None, str(tmp_path / "a")) == a
    assert resolve_spec(None, None, a) == a
