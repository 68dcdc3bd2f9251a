"""The fast paths a Fabric run of a ``transformers`` model takes: the attention its model
runs, whether its decoder layers are compiled, whether its optimizer is fused, how its
loss reads the logits (``cross_entropy.py``). Each is a
recipe setting whose ``auto`` is the fastest path on a GPU and the plain path on a CPU;
``FastPaths.resolve`` decides them once, ``describe`` is the one line the run logs when
it starts (``FabricBackend(fast_paths=...)``) and ``settings`` what it records.

- **attention** (``--attention auto|sdpa|flex|eager``): ``flex`` is ``transformers``'
  ``flex_attention``. Rows that pack several documents reach the model with restarting
  ``position_ids`` and no attention mask; ``transformers`` finds the documents
  (``masking_utils.find_packed_sequence_indices``) and builds their block-causal mask,
  which with ``flex_attention`` is a ``BlockMask`` (``masking_utils.flex_attention_mask``:
  ``create_block_mask``, compiled) whose masked-out blocks are skipped, and the kernel
  is ``torch.compile(flex_attention)`` (``integrations.flex_attention``); ``prepare``
  hands the model that same mask built on the device (``document_mask.py``), so finding
  the documents does not wait for the device in every forward pass. With ``sdpa``
  the same mask is a dense ``[seq, seq]`` tensor: every block is computed and no flash
  kernel can take it. ``auto`` is ``flex`` on CUDA for packed rows (post-training), else
  ``sdpa``: rows of one document (pretraining windows) take sdpa's causal flash path, and
  on a CPU sdpa is the plain path. torch's FlexAttention has no backward pass on a CPU,
  so ``flex`` is refused there for training.
- **compiled layers** (``--compile-layers auto|on|off``, ``auto``: on CUDA): each decoder
  layer (the classes the model names in ``_no_split_modules``) is compiled in place with
  ``module.compile()``, a regional compile: the module keeps its place and names, so
  state dict keys (checkpoints, resumes, exports) gain no ``_orig_mod``, and Fabric wraps
  the model (DDP, FSDP) afterwards as it would the plain one.
- **fused optimizer** (``--fused-optimizer auto|on|off``, ``auto``: on CUDA): AdamW's
  ``fused=True`` kernel. On a CPU torch's fused AdamW matches its ``foreach`` one to
  about 1e-7 (fp32), and the CPU default stays the plain path.
- **cross entropy** (``--cross-entropy auto|chunked|fused|full``): the loss and the
  targets' log-probabilities a chunk of tokens at a time, without the full float32
  logits (``cross_entropy.resolve_cross_entropy`` decides it from the model's config;
  ``auto``: chunked, or Liger's fused kernel where installed, on CUDA; the full logits on
  a CPU).

Example::

    paths = FastPaths.resolve(attention="auto", compile_layers="auto",
                              fused_optimizer="auto", cross_entropy="auto", device="cuda",
                              packed=True, model_config=config)
    paths.describe()
    # 'fast paths: attention flex (flex_attention, block mask of the rows' documents),
    #  decoder layers compiled, fused AdamW,
    #  cross entropy chunked (auto: liger_kernel is not installed)'
    model = AutoModelForCausalLM.from_config(config, attn_implementation=paths.attn_implementation)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **paths.optimizer_options())
    FabricBackend(lambda: model, ..., fast_paths=paths)  # compiles the layers, logs the line
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from baton.backends.fabric.cross_entropy import (
    CROSS_ENTROPY_CHOICES,
    FULL,
    CrossEntropy,
    resolve_cross_entropy,
)
from baton.backends.fabric.document_mask import use_document_block_mask
from baton.core.errors import UsageError

#: the choices of ``--attention``
ATTENTION_CHOICES = ("auto", "sdpa", "flex", "eager")
#: the choices of ``--compile-layers`` and ``--fused-optimizer``
SWITCH_CHOICES = ("auto", "on", "off")
#: ``transformers``' ``attn_implementation`` of each attention path
ATTN_IMPLEMENTATIONS = {"sdpa": "sdpa", "flex": "flex_attention", "eager": "eager"}


def run_device(accelerator: str) -> str:
    """The device type a run on ``accelerator`` trains on: ``cuda`` unless it asks for
    the CPU or no GPU is there, else ``cpu`` (where the reference is scored too)."""
    return "cuda" if accelerator != "cpu" and torch.cuda.is_available() else "cpu"


def supports_flex(config: Any) -> bool:
    """Whether the ``transformers`` causal LM of ``config`` offers ``flex_attention``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return False
    return bool(getattr(model_class, "_supports_flex_attn", False))


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UsageError(f"--{flag} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _switch(flag: str, value: str, *, cuda: bool) -> bool:
    """``on``/``off``, or ``auto``: on where the run trains on CUDA."""
    chosen = _choice(flag, value, SWITCH_CHOICES)
    return cuda if chosen == "auto" else chosen == "on"


@dataclass(frozen=True)
class FastPaths:
    """The resolved paths of a run (see the module docs)."""

    #: ``sdpa``, ``flex`` or ``eager``
    attention: str = "sdpa"
    #: each decoder layer compiled (``module.compile()``)
    compiled_layers: bool = False
    #: AdamW's fused kernel
    fused_optimizer: bool = False
    #: how the loss reads the logits (chunked, fused or full) and why
    cross_entropy: CrossEntropy = FULL

    @classmethod
    def resolve(
        cls,
        *,
        attention: str = "auto",
        compile_layers: str = "auto",
        fused_optimizer: str = "auto",
        cross_entropy: str = "full",
        device: str,
        packed: bool,
        model_config: Any = None,
        flex_supported: bool = True,
    ) -> FastPaths:
        """The paths of a run on ``device`` (``cuda`` or ``cpu``; ``run_device``) from the
        recipe's settings; ``packed``: rows pack several documents (post-training);
        ``model_config``: the ``transformers`` config, which decides whether the model
        offers ``flex_attention`` (``supports_flex``; else ``flex_supported``) and the
        cross entropy's path (without it the ``--cross-entropy`` value is only checked:
        the call that refuses bad values before anything is written). A bad value or a
        path that cannot train here is a ``UsageError`` naming the flag."""
        cuda = device == "cuda"
        if model_config is not None:
            flex_supported = supports_flex(model_config)
            loss_path = resolve_cross_entropy(cross_entropy, model_config, device=device)
        else:
            _choice("cross-entropy", cross_entropy, CROSS_ENTROPY_CHOICES)
            loss_path = FULL
        chosen = _choice("attention", attention, ATTENTION_CHOICES)
        if chosen == "auto":
            chosen = "flex" if cuda and packed and flex_supported else "sdpa"
        elif chosen == "flex" and not cuda:
            raise UsageError(
                "--attention flex trains on a GPU only (torch's FlexAttention has no "
                "backward pass on a CPU): use --attention sdpa or auto"
            )
        elif chosen == "flex" and not flex_supported:
            raise UsageError(
                "--attention flex: this model's transformers class has no flex_attention; "
                "use --attention sdpa or auto"
            )
        return cls(
            attention=chosen,
            compiled_layers=_switch("compile-layers", compile_layers, cuda=cuda),
            fused_optimizer=_switch("fused-optimizer", fused_optimizer, cuda=cuda),
            cross_entropy=loss_path,
        )

    @property
    def attn_implementation(self) -> str:
        """``transformers``' name of the attention path (``from_config(attn_implementation=)``)."""
        return ATTN_IMPLEMENTATIONS[self.attention]

    def optimizer_options(self) -> dict[str, Any]:
        """AdamW's keyword arguments for this run's optimizer path."""
        return {"fused": True} if self.fused_optimizer else {}

    def describe(self) -> str:
        """One line saying which paths run."""
        attention = {
            "flex": "attention flex (flex_attention, block mask of the rows' documents)",
            "sdpa": "attention sdpa",
            "eager": "attention eager",
        }[self.attention]
        parts = [
            attention,
            "decoder layers compiled" if self.compiled_layers else "decoder layers eager",
            "fused AdamW" if self.fused_optimizer else "AdamW unfused",
            self._cross_entropy_part(),
        ]
        return "fast paths: " + ", ".join(parts)

    def _cross_entropy_part(self) -> str:
        reason = self.cross_entropy.reason
        why = "" if reason == "asked" else f" ({reason})"
        return f"cross entropy {self.cross_entropy.path}{why}"

    def settings(self) -> dict[str, Any]:
        """What the run records of its paths (its settings' ``fast_paths``)."""
        recorded = asdict(self)
        recorded["cross_entropy"] = self.cross_entropy.path
        return {"fast_paths": recorded}

    def prepare(self, model: nn.Module) -> None:
        """Apply the paths that act on the built model (before Fabric wraps it): with
        ``flex``, the documents' block mask built by baton (``document_mask.py``: no host
        sync), and each decoder layer compiled when ``compiled_layers``."""
        if self.attention == "flex":
            use_document_block_mask(model)
        if self.compiled_layers:
            compile_decoder_layers(model)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a ``transformers`` model: its modules of the classes it
    names in ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


def compile_decoder_layers(model: nn.Module) -> int:
    """Compile each decoder layer of ``model`` in place (``module.compile()``: its state
    dict keys stay as they are); returns how many. A model without named decoder layers
    is a ``UsageError``."""
    layers = decoder_layers(model)
    if not layers:
        raise UsageError(
            f"--compile-layers on: {type(model).__name__} names no decoder layer class "
            "(_no_split_modules) to compile; use --compile-layers off"
        )
    for layer in layers:
        layer.compile()
    return len(layers)
