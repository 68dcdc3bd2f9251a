"""The Qwen3 family in the model spec: dense Qwen3 (QK norm, head_dim independent of the
width) and Qwen3-MoE (experts) read, recorded, compared, written back, and refused by
name by a backend that cannot build them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.core.errors import UsageError
from baton.core.model.spec import (
    LlamaSpec,
    ModelSpec,
    MoeSpec,
    check_same_architecture,
    first_difference,
)

QWEN3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # not hidden_size / heads (16)
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
}
MOE = {
    **QWEN3,
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_hidden_layers": 3,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "router_aux_loss_coef": 0.01,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
}


def _write(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_qwen3_and_qwen3_moe_are_read_and_round_trip(tmp_path):
    dense = ModelSpec.from_hf(_write(tmp_path / "dense", QWEN3))
    assert (dense.family, dense.head_dim, dense.rope_theta, dense.qk_norm) == (
        "qwen3", 32, 1e6, True,
    )  # fmt: skip
    assert dense.moe is None
    moe = ModelSpec.from_hf(_write(tmp_path / "moe", MOE))
    assert moe.moe == MoeSpec(4, 2, 32, True, 0.01, 1, (1,))
    assert [moe.moe.is_sparse(layer) for layer in range(3)] == [True, False, True]
    for spec in (dense, moe):
        assert ModelSpec.from_hf_dict(spec.to_hf_config()) == spec
        recorded = json.loads(json.dumps(spec.to_dict()))  # as run.json holds it
        assert ModelSpec.from_dict(recorded) == spec
        check_same_architecture(recorded, spec.to_dict(), what="x")
    assert LlamaSpec is ModelSpec  # existing callers keep their name


def test_transformers_reads_the_written_configs_back_to_the_same_spec(tmp_path):
    transformers = pytest.importorskip("transformers")
    for config, kind in ((QWEN3, transformers.Qwen3Config), (MOE, transformers.Qwen3MoeConfig)):
        spec = ModelSpec.from_hf_dict(config)
        _write(tmp_path / spec.family, spec.to_hf_config())
        loaded = kind.from_pretrained(tmp_path / spec.family)
        assert type(loaded) is kind
        loaded.save_pretrained(tmp_path / f"{spec.family}-again")
        assert ModelSpec.from_hf(tmp_path / f"{spec.family}-again") == spec
        if spec.moe is not None:
            assert (loaded.num_experts, loaded.num_experts_per_tok) == (4, 2)
            assert loaded.mlp_only_layers == [1]


def test_differences_are_named_down_to_the_expert_field():
    moe = ModelSpec.from_hf_dict(MOE)
    more = ModelSpec.from_hf_dict({**MOE, "num_experts_per_tok": 3})
    assert first_difference(moe.to_dict(), more.to_dict()) == "moe.experts_per_token"
    dense = ModelSpec.from_hf_dict(QWEN3)
    llama = ModelSpec.from_hf_dict({**QWEN3, "model_type": "llama"})
    assert first_difference(dense.to_dict(), llama.to_dict()) == "family"
    with pytest.raises(UsageError, match="family is 'llama' there, 'qwen3' here"):
        check_same_architecture(llama.to_dict(), dense.to_dict(), what="checkpoint c")
    old = {k: v for k, v in llama.to_dict().items() if k not in ("family", "moe")}
    assert first_difference(old, llama.to_dict()) is None  # recorded before families


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"use_sliding_window": True}, "use_sliding_window is True"),
        ({"model_type": "qwen2"}, "model_type is 'qwen2'"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"num_experts": 0}, "num_experts"),
    ],
)
def test_unsupported_qwen3_configs_are_refused_by_name(change, named):
    with pytest.raises(UsageError, match=named):
        ModelSpec.from_hf_dict({**MOE, **change})


def test_a_backend_refuses_a_family_it_cannot_build_by_name():
    moe = ModelSpec.from_hf_dict(MOE)
    moe.require_family({"llama", "qwen3_moe"}, backend="fabric")
    with pytest.raises(UsageError, match="megatron cannot build model_type 'qwen3_moe' yet"):
        moe.require_family({"llama"}, backend="megatron")
