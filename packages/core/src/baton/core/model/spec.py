"""One model definition (the Llama and Qwen3 families), read from a Hugging Face
``config.json``.

Every LLM backend builds the architecture a :class:`ModelSpec` describes natively
(TorchTitan model args, Megatron-Core ``TransformerConfig``, MaxText config keys,
``transformers`` for Fabric). The spec is plain data: this module imports no framework.
Its ``family`` is the ``model_type`` it was read from: ``llama``, ``qwen3`` (QK norm,
``head_dim`` independent of the width) or ``qwen3_moe`` (Qwen3 with mixture-of-experts
MLPs, described by a :class:`MoeSpec`). A backend that cannot build a family refuses it
by name before building anything (:meth:`ModelSpec.require_family`).

Example::

    from baton.core.model.spec import ModelSpec, check_same_architecture

    spec = ModelSpec.from_hf("tiny-llama/")         # a directory or its config.json
    spec.family                                      # "llama", "qwen3" or "qwen3_moe"
    spec.moe                                         # MoeSpec(num_experts=4, ...) or None
    spec.require_family({"llama"}, backend="megatron")  # UsageError for a Qwen3
    spec.to_dict()                                   # recorded in run.json and checkpoints
    spec.to_hf_config()                              # config.json for an export
    spec.rope_scaling                                # RopeScaling(factor=8.0, ...) or None
    check_same_architecture(spec.to_dict(), other.to_dict(), what="--init-from tiny/")
    # UsageError: --init-from tiny/ has a different architecture: num_layers is 4 there, 2 here ...
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, cast

from baton.core.errors import ExportError, UsageError
from baton.core.model.moe import MoeSpec
from baton.core.model.rope_scaling import ROPE_TYPES, RopeScaling

__all__ = [
    "FAMILIES",
    "QK_NORM_FAMILIES",
    "ROPE_TYPES",
    "LlamaSpec",
    "ModelSpec",
    "MoeSpec",
    "RopeScaling",
    "check_init_from",
    "check_same_architecture",
    "exported_spec",
    "first_difference",
    "is_hf_dir",
    "recorded_spec",
    "resolve_spec",
]

#: ``config.json`` values a spec cannot express, with the value it requires
_REQUIRED = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "use_sliding_window": False,
}
#: the families (Hugging Face ``model_type``) a spec describes, with their model class
FAMILIES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
#: the families whose attention normalises queries and keys per head (RMSNorm)
QK_NORM_FAMILIES = frozenset({"qwen3", "qwen3_moe"})


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only Llama-style model: RMSNorm, SwiGLU MLP, rotary positions (optionally
    Llama 3.1-style scaled), grouped-query attention, no biases; a Qwen3 adds QK norm, a
    Qwen3-MoE also mixture-of-experts MLPs (``moe``). Field names follow the
    architecture, not one framework."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    head_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_seq_len: int = 2048
    #: Llama 3.1-style rotary scaling; ``None``: plain rotary positions
    rope_scaling: RopeScaling | None = None
    #: the Hugging Face ``model_type`` (a key of :data:`FAMILIES`)
    family: str = "llama"
    #: the experts of a ``qwen3_moe`` model; ``None`` for a dense one
    moe: MoeSpec | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise UsageError(
                f"model spec: family {self.family!r} is not supported; supported: "
                f"{', '.join(map(repr, FAMILIES))}"
            )
        if (self.moe is not None) != (self.family == "qwen3_moe"):
            raise UsageError(
                f"model spec: family {self.family!r} "
                + ("needs experts (moe)" if self.moe is None else "has no experts (moe)")
            )
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "ffn_hidden_size", "head_dim", "max_seq_len"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(f"model spec: {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise UsageError(
                f"model spec: num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise UsageError(f"model spec: head_dim must be even for rotary, got {self.head_dim}")

    @classmethod
    def from_hf(cls, path: str | Path) -> ModelSpec:
        """The spec of a Hugging Face ``config.json`` (``path`` is the file or its
        directory). Raises ``UsageError`` naming the field for anything a spec cannot
        build (another model type, a rotary type other than ``default`` and ``llama3``,
        biases, another activation, sliding-window attention)."""
        file = Path(path)
        if file.is_dir():
            file = file / "config.json"
        if not file.is_file():
            raise UsageError(
                f"--model-config {path}: no config.json there; pass a Hugging Face model "
                "directory (save_pretrained) or its config.json"
            )
        try:
            config = json.loads(file.read_text())
        except json.JSONDecodeError as error:
            raise UsageError(f"{file} is not valid JSON: {error}") from None
        return cls.from_hf_dict(config, source=str(file))

    @classmethod
    def from_hf_dict(cls, config: dict[str, Any], *, source: str = "config.json") -> ModelSpec:
        """The spec of a parsed ``config.json`` (see :meth:`from_hf`)."""
        family = config.get("model_type")
        if family not in FAMILIES:
            supported = ", ".join(f"{name!r} ({model})" for name, model in FAMILIES.items())
            raise UsageError(f"{source}: model_type is {family!r}; supported: {supported}")
        for key, required in _REQUIRED.items():
            if key in config and config[key] != required:
                raise UsageError(f"{source}: {key} is {config[key]!r}; supported: {required!r}")
        # transformers 5 writes rope_parameters (theta inside); earlier versions and the
        # hub's Llama 3.x configs write rope_theta and rope_scaling
        parameters: dict[str, Any] = config.get("rope_parameters") or {}
        scaling_entry: dict[str, Any] = config.get("rope_scaling") or parameters
        theta: Any = config.get("rope_theta") or parameters.get("rope_theta") or 10000.0
        scaling = RopeScaling.from_hf_dict(scaling_entry, source=source)
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            # Qwen3Config's head_dim defaults to 128, whatever the width
            head_dim = config.get("head_dim") or (128 if family == "qwen3" else hidden // heads)
            return cls(
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                ffn_hidden_size=int(config["intermediate_size"]),
                head_dim=int(head_dim),
                rope_theta=float(theta),
                norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(config.get("tie_word_embeddings", False)),
                max_seq_len=int(config.get("max_position_embeddings", 2048)),
                rope_scaling=scaling,
                family=family,
                moe=MoeSpec.from_hf_dict(config) if family == "qwen3_moe" else None,
            )
        except KeyError as error:
            raise UsageError(f"{source}: missing {error.args[0]!r}") from None

    @property
    def qk_norm(self) -> bool:
        """Whether attention normalises queries and keys per head (Qwen3)."""
        return self.family in QK_NORM_FAMILIES

    def require_family(self, families: Collection[str], *, backend: str) -> None:
        """Raise ``UsageError`` unless ``backend`` builds this spec's family (one of
        ``families``); call it before building anything."""
        if self.family not in families:
            builds = ", ".join(repr(name) for name in FAMILIES if name in families)
            raise UsageError(
                f"{backend} cannot build model_type {self.family!r} yet; it builds {builds}. "
                "Train this model with recipes/hf_finetune.py (Fabric through transformers)"
            )

    def to_hf_config(self, *, dtype: str = "float32") -> dict[str, Any]:
        """A ``config.json`` that ``transformers`` (LlamaConfig, Qwen3Config or
        Qwen3MoeConfig) reads back to this spec."""
        config: dict[str, Any] = {
            "architectures": [FAMILIES[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.ffn_hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.norm_eps,
            "max_position_embeddings": self.max_seq_len,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_embeddings,
            "attention_bias": False,
            "torch_dtype": dtype,
        }
        if self.family == "llama":
            config["mlp_bias"] = False
        else:
            config["use_sliding_window"] = False
        if self.rope_scaling is not None:
            config["rope_scaling"] = self.rope_scaling.to_hf()
        if self.moe is not None:
            config.update(self.moe.to_hf())
        return config

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (recorded in ``run.json`` and every checkpoint)."""
        data = asdict(self)
        data["moe"] = self.moe.to_dict() if self.moe is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """The spec :meth:`to_dict` wrote (one recorded before families: a Llama)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if isinstance(values.get("rope_scaling"), dict):
            values["rope_scaling"] = RopeScaling(**values["rope_scaling"])
        if isinstance(values.get("moe"), dict):
            values["moe"] = MoeSpec(**values["moe"])
        return cls(**values)

    def with_vocab(self, vocab_size: int) -> ModelSpec:
        """The same architecture with another vocabulary size."""
        return replace(self, vocab_size=vocab_size)


#: the name existing callers use (a spec of any family)
LlamaSpec = ModelSpec


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    """A recorded spec's values by field name, the experts' as ``moe.<name>``; a field a
    spec recorded before it existed has its default (an old record is a dense Llama)."""
    flat: dict[str, Any] = {}
    for field in fields(ModelSpec):
        value: Any = data.get(field.name, field.default)
        if field.name == "moe" and isinstance(value, dict):
            experts = MoeSpec(**cast("dict[str, Any]", value)).to_dict()
            flat.update({f"moe.{name}": item for name, item in experts.items()})
        else:
            flat[field.name] = value
    return flat


def first_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first spec field (in declaration order; an expert field as ``moe.<name>``)
    whose value differs, or ``None``."""
    before, now = _flat(saved), _flat(current)
    for name in dict.fromkeys([*before, *now]):
        if before.get(name) != now.get(name):
            return name
    return None


def check_same_architecture(
    saved: dict[str, Any] | None,
    current: dict[str, Any] | None,
    *,
    what: str,
    fix: str = "use the same --model-config (or none) as that run",
) -> None:
    """Raise ``UsageError`` when two recorded specs differ, naming the first field and
    ``fix``; a missing spec on either side (a run from before specs were recorded) passes."""
    if not saved or not current:
        return
    name = first_difference(saved, current)
    if name is not None:
        raise UsageError(
            f"{what} has a different architecture: {name} is {_flat(saved).get(name)!r} "
            f"there, {_flat(current).get(name)!r} here; {fix}"
        )


def resolve_spec(
    model_config: str | None, init_from: str | None, default: ModelSpec | None = None
) -> ModelSpec | None:
    """The spec a recipe trains: ``--model-config``, else the ``--init-from`` Hugging Face
    directory's, else ``default``. Both given and different: ``UsageError`` naming the
    first differing field."""
    spec = ModelSpec.from_hf(model_config) if model_config else None
    if init_from and is_hf_dir(init_from):
        source = ModelSpec.from_hf(init_from)
        if spec is not None:
            check_same_architecture(
                source.to_dict(), spec.to_dict(), what=f"--init-from {init_from}"
            )
        spec = source
    return spec or default


def is_hf_dir(path: str | Path) -> bool:
    """Whether ``path`` is a Hugging Face model directory (a ``config.json``, no baton
    checkpoint metadata), as opposed to a baton checkpoint."""
    folder = Path(path)
    return (folder / "config.json").is_file() and not (folder / "baton.json").is_file()


def recorded_spec(checkpoint: str | Path) -> dict[str, Any] | None:
    """The spec a baton checkpoint recorded (``baton.json`` settings), if any."""
    for meta in (Path(checkpoint) / "baton.json", Path(checkpoint).parent / "baton.json"):
        if meta.is_file():
            return json.loads(meta.read_text()).get("settings", {}).get("model_spec")
    return None


def exported_spec(checkpoint: str | Path) -> ModelSpec:
    """The spec a checkpoint must record to be exported to Hugging Face format."""
    recorded = recorded_spec(checkpoint)
    if recorded is None:
        raise ExportError(
            f"{checkpoint} records no model spec: only runs built from a Hugging Face "
            "config (--model-config or --init-from HF_DIR) export to Hugging Face format"
        )
    return ModelSpec.from_dict(recorded)


def check_init_source(init_from: str | Path) -> None:
    """Refuse (``UsageError``) an ``--init-from`` that is no model: a missing path, or a
    tokenizer directory (``tokenizer.json``, no ``config.json`` and no checkpoint)."""
    path = Path(init_from)
    model = "a Hugging Face model directory (save_pretrained: config.json and weights)"
    if not path.exists():
        raise UsageError(
            f"--init-from {path} does not exist; pass {model} or a baton checkpoint "
            "(RUN_DIR/checkpoints/step_NNNNNN)"
        )
    checkpoint = (path / "baton.json").is_file() or (path.parent / "baton.json").is_file()
    if (path / "tokenizer.json").is_file() and not is_hf_dir(path) and not checkpoint:
        raise UsageError(
            f"--init-from {path} is a tokenizer directory (tokenizer.json, no config.json); "
            f"pass {model} or a baton checkpoint, and the tokenizer with --tokenizer"
        )


def check_init_from(init_from: str | None, spec: ModelSpec | None) -> None:
    """Refuse ``--init-from`` of no model (:func:`check_init_source`) or of a baton
    checkpoint whose recorded architecture differs from ``spec``, naming the first
    differing field (a Hugging Face directory is read by :func:`resolve_spec` instead)."""
    if init_from:
        check_init_source(init_from)
    if init_from and spec is not None and not is_hf_dir(init_from):
        check_same_architecture(
            recorded_spec(init_from), spec.to_dict(), what=f"--init-from {init_from}"
        )
