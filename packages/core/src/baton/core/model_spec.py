"""One Llama-family model definition, read from a Hugging Face ``config.json``.

Every LLM backend builds the architecture a :class:`LlamaSpec` describes natively
(TorchTitan model args, Megatron-Core ``TransformerConfig``, MaxText config keys,
``transformers`` for Fabric). The spec is plain data: this module imports no framework.

Example::

    from baton.core.model_spec import LlamaSpec, check_same_architecture

    spec = LlamaSpec.from_hf("tiny-llama/")         # a directory or its config.json
    spec.to_dict()                                   # recorded in run.json and checkpoints
    spec.to_hf_config()                              # config.json for an export
    spec.rope_scaling                                # RopeScaling(factor=8.0, ...) or None
    check_same_architecture(spec.to_dict(), other.to_dict(), what="--init-from tiny/")
    # UsageError: --init-from tiny/ has a different architecture: num_layers is 4 there, 2 here ...
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from baton.core.errors import ExportError, UsageError

#: ``config.json`` values a Llama spec cannot express, with the value it requires
_REQUIRED = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}
#: the rotary types a Llama spec builds (Hugging Face's ``rope_type``)
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1-style rotary frequency scaling (Hugging Face ``rope_type: "llama3"``):
    frequencies whose wavelength exceeds ``original_max_position_embeddings /
    low_freq_factor`` are divided by ``factor``, those under ``original_max_position_embeddings
    / high_freq_factor`` are kept, and the band between is interpolated.

    Llama 3.1's values are ``RopeScaling(8.0, 1.0, 4.0, 8192)``; Llama 3.2's factor is 32.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise UsageError(
                f"model spec: rope_scaling factor must be positive, got {self.factor!r}"
            )
        if not self.high_freq_factor > self.low_freq_factor > 0:
            raise UsageError(
                "model spec: rope_scaling needs high_freq_factor > low_freq_factor > 0, got "
                f"{self.high_freq_factor!r} and {self.low_freq_factor!r}"
            )
        original: Any = self.original_max_position_embeddings  # as read from JSON
        if not isinstance(original, int) or isinstance(original, bool) or original <= 0:
            raise UsageError(
                "model spec: rope_scaling original_max_position_embeddings must be a positive "
                f"integer, got {original!r}"
            )

    @classmethod
    def from_hf_dict(cls, scaling: dict[str, Any], *, source: str) -> RopeScaling | None:
        """The scaling of a ``config.json``'s ``rope_scaling`` or ``rope_parameters``
        (``None`` for plain rotary positions); any other ``rope_type`` is a ``UsageError``
        naming it."""
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise UsageError(
                f"{source}: rope_type {rope_type!r} is not supported; supported: 'default' "
                "(plain rotary positions) and 'llama3' (Llama 3.1-style rope_scaling)"
            )
        if rope_type == "default":
            return None
        missing = [field.name for field in fields(cls) if field.name not in scaling]
        if missing:
            raise UsageError(f"{source}: rope_scaling of type 'llama3' needs {', '.join(missing)}")
        return cls(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )

    def to_hf(self) -> dict[str, Any]:
        """The ``rope_scaling`` entry of a ``config.json``."""
        return {"rope_type": "llama3", **asdict(self)}

    def refuse_unless(self, fixed: dict[str, Any], *, backend: str) -> None:
        """Raise ``UsageError`` naming every value that differs from ``fixed``: the values
        ``backend`` cannot set (they are constants of its rotary embedding)."""
        differ = [name for name, value in fixed.items() if getattr(self, name) != value]
        if differ:
            have = ", ".join(f"{name}={getattr(self, name)!r}" for name in differ)
            need = ", ".join(f"{name}={fixed[name]!r}" for name in differ)
            raise UsageError(
                f"{backend} cannot build this rope_scaling: it has {have}, and {backend} "
                f"fixes {need}; train this model on TorchTitan or Fabric (any llama3 scaling)"
            )


@dataclass(frozen=True)
class LlamaSpec:
    """A decoder-only Llama model: RMSNorm, SwiGLU MLP, rotary positions (optionally
    Llama 3.1-style scaled), grouped-query attention, no biases. Field names follow the
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

    def __post_init__(self) -> None:
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
    def from_hf(cls, path: str | Path) -> LlamaSpec:
        """The spec of a Hugging Face Llama ``config.json`` (``path`` is the file or its
        directory). Raises ``UsageError`` naming the field for anything a Llama spec cannot
        build (another model type, a rotary type other than ``default`` and ``llama3``,
        biases, another activation)."""
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
    def from_hf_dict(cls, config: dict[str, Any], *, source: str = "config.json") -> LlamaSpec:
        """The spec of a parsed ``config.json`` (see :meth:`from_hf`)."""
        model_type = config.get("model_type")
        if model_type != "llama":
            raise UsageError(
                f"{source}: model_type is {model_type!r}; only Llama-family configs "
                "(model_type 'llama', LlamaForCausalLM) are supported"
            )
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
            return cls(
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                ffn_hidden_size=int(config["intermediate_size"]),
                head_dim=int(config.get("head_dim") or hidden // heads),
                rope_theta=float(theta),
                norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(config.get("tie_word_embeddings", False)),
                max_seq_len=int(config.get("max_position_embeddings", 2048)),
                rope_scaling=scaling,
            )
        except KeyError as error:
            raise UsageError(f"{source}: missing {error.args[0]!r}") from None

    def to_hf_config(self, *, dtype: str = "float32") -> dict[str, Any]:
        """A ``config.json`` that ``transformers.LlamaConfig`` reads back to this spec."""
        config: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
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
            "mlp_bias": False,
            "torch_dtype": dtype,
        }
        if self.rope_scaling is not None:
            config["rope_scaling"] = self.rope_scaling.to_hf()
        return config

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (recorded in ``run.json`` and every checkpoint)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaSpec:
        """The spec :meth:`to_dict` wrote."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if isinstance(values.get("rope_scaling"), dict):
            values["rope_scaling"] = RopeScaling(**values["rope_scaling"])
        return cls(**values)

    def with_vocab(self, vocab_size: int) -> LlamaSpec:
        """The same architecture with another vocabulary size."""
        return replace(self, vocab_size=vocab_size)


def first_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first spec field (in declaration order) whose value differs, or ``None``."""
    for field in fields(LlamaSpec):
        if saved.get(field.name) != current.get(field.name):
            return field.name
    return None


def check_same_architecture(
    saved: dict[str, Any] | None, current: dict[str, Any] | None, *, what: str
) -> None:
    """Raise ``UsageError`` when two recorded specs differ, naming the first field; a
    missing spec on either side (a run from before specs were recorded) passes."""
    if not saved or not current:
        return
    name = first_difference(saved, current)
    if name is not None:
        raise UsageError(
            f"{what} has a different architecture: {name} is {saved.get(name)!r} there, "
            f"{current.get(name)!r} here; use the same --model-config (or none) as that run"
        )


def resolve_spec(
    model_config: str | None, init_from: str | None, default: LlamaSpec | None = None
) -> LlamaSpec | None:
    """The spec a recipe trains: ``--model-config``, else the ``--init-from`` Hugging Face
    directory's, else ``default``. Both given and different: ``UsageError`` naming the
    first differing field."""
    spec = LlamaSpec.from_hf(model_config) if model_config else None
    if init_from and is_hf_dir(init_from):
        source = LlamaSpec.from_hf(init_from)
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


def exported_spec(checkpoint: str | Path) -> LlamaSpec:
    """The Llama spec a checkpoint must record to be exported to Hugging Face format."""
    recorded = recorded_spec(checkpoint)
    if recorded is None:
        raise ExportError(
            f"{checkpoint} records no Llama model spec: only runs built from a Hugging Face "
            "config (--model-config or --init-from HF_DIR) export to Hugging Face format"
        )
    return LlamaSpec.from_dict(recorded)


def check_init_from(init_from: str | None, spec: LlamaSpec | None) -> None:
    """Refuse ``--init-from`` of a baton checkpoint whose recorded architecture differs
    from ``spec``, naming the first differing field (a Hugging Face directory is read by
    :func:`resolve_spec` instead)."""
    if init_from and spec is not None and not is_hf_dir(init_from):
        check_same_architecture(
            recorded_spec(init_from), spec.to_dict(), what=f"--init-from {init_from}"
        )
