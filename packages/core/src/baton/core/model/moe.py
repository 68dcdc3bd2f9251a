"""The mixture-of-experts MLPs of a ``qwen3_moe`` model, the ``moe`` of a
:class:`ModelSpec` (:mod:`baton.core.model.spec`, which re-exports it).

Example::

    from baton.core.model.moe import MoeSpec

    experts = MoeSpec.from_hf_dict(config)   # a parsed qwen3_moe config.json
    experts.num_experts, experts.experts_per_token
    experts.is_sparse(0)                     # False for a layer in mlp_only_layers
    experts.to_hf()                          # its config.json entries
    MoeSpec(**experts.to_dict()) == experts  # True: plain JSON data round-trips
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from baton.core.errors import UsageError


@dataclass(frozen=True)
class MoeSpec:
    """The mixture-of-experts MLPs of a ``qwen3_moe`` model: each token goes to the
    ``experts_per_token`` experts its router scores highest, each expert a SwiGLU MLP of
    width ``expert_ffn_hidden_size``. Names follow the architecture; the Hugging Face
    ``config.json`` key of each is in its comment."""

    num_experts: int  # num_experts
    experts_per_token: int  # num_experts_per_tok
    expert_ffn_hidden_size: int  # moe_intermediate_size
    #: renormalise the top-k router weights to sum to one (norm_topk_prob)
    norm_topk_prob: bool = False
    #: weight of the load-balancing loss added to the loss (router_aux_loss_coef)
    aux_loss_coef: float = 0.001
    #: every ``sparse_step``-th layer is sparse (decoder_sparse_step)
    sparse_step: int = 1
    #: layers with a dense MLP of the model's ``ffn_hidden_size`` (mlp_only_layers)
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "expert_ffn_hidden_size", "sparse_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(
                    f"model spec: moe {name} must be a positive integer, got {value!r}"
                )
        if self.experts_per_token > self.num_experts:
            raise UsageError(
                f"model spec: num_experts_per_tok ({self.experts_per_token}) exceeds "
                f"num_experts ({self.num_experts})"
            )
        object.__setattr__(self, "dense_layers", tuple(int(i) for i in self.dense_layers))

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer`` (0-based) has experts (as ``transformers`` decides)."""
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0

    @classmethod
    def from_hf_dict(cls, config: dict[str, Any]) -> MoeSpec:
        """The experts of a ``qwen3_moe`` ``config.json`` (defaults: Qwen3MoeConfig's;
        ``transformers`` 5 writes ``num_experts`` as ``num_local_experts``)."""
        return cls(
            num_experts=int(config.get("num_experts", config.get("num_local_experts", 128))),
            experts_per_token=int(config.get("num_experts_per_tok", 8)),
            expert_ffn_hidden_size=int(config.get("moe_intermediate_size", 768)),
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            aux_loss_coef=float(config.get("router_aux_loss_coef", 0.001)),
            sparse_step=int(config.get("decoder_sparse_step", 1)),
            dense_layers=tuple(config.get("mlp_only_layers") or ()),
        )

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` entries of these experts."""
        return {
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.experts_per_token,
            "moe_intermediate_size": self.expert_ffn_hidden_size,
            "norm_topk_prob": self.norm_topk_prob,
            "router_aux_loss_coef": self.aux_loss_coef,
            "decoder_sparse_step": self.sparse_step,
            "mlp_only_layers": list(self.dense_layers),
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (a list of dense layers)."""
        return {**asdict(self), "dense_layers": list(self.dense_layers)}
