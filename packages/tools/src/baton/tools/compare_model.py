"""The model ``baton compare`` starts every backend from: a tiny Llama built from flags,
a model written from a Hugging Face ``config.json`` (Llama, Qwen3 or Qwen3-MoE) with
``transformers``' own classes, or a ``save_pretrained`` directory, checked against the
tokenizer.

Example::

    spec = tiny_llama_spec(layers=2, hidden=64, heads=4, vocab_size=2048, seq_len=32)
    save_model(spec, Path("runs/compare_backends/model"))
    save_model(ModelSpec.from_hf("qwen3_moe.json"), Path("runs/compare_backends/model"))
    check_model("runs/compare_backends/model", tokenizer_vocab=2048)
    starting_model(None, None, "runs/tok", Path("runs/compare_backends/model"),
                   {"layers": 6, "hidden": 256, "heads": 16, "seq_len": 128})
"""

from __future__ import annotations

from pathlib import Path

from baton.core.errors import UsageError
from baton.core.model.spec import LlamaSpec, ModelSpec, is_hf_dir

#: what the loss each backend logs holds for a mixture-of-experts model, and so which
#: differences between their curves to expect (see docs/one-model.md)
MOE_LOSSES = {
    "fabric": "loss = cross entropy + transformers' load-balancing term (all layers' "
    "tokens pooled), logged as moe/aux_loss",
    "torchtitan": "loss = cross entropy alone: TorchTitan adds no load-balancing loss",
    "megatron": "loss = cross entropy alone: its load-balancing term (a Switch loss a "
    "layer, summed) goes to the gradient only, logged as moe/aux_loss",
    "maxtext": "loss = cross entropy + its load-balancing term (a Switch loss a "
    "sequence, averaged over sequences and layers), logged as moe/aux_loss",
}


def llama_ffn(hidden: int) -> int:
    """Llama's SwiGLU width: 8/3 of the model width rounded up to a multiple of 256."""
    return -(-8 * hidden // 3 // 256) * 256


def tiny_llama_spec(
    *, layers: int, hidden: int, heads: int, vocab_size: int, seq_len: int
) -> LlamaSpec:
    """The Llama ``baton compare`` builds when no model is given: the vocabulary rounded
    up to a multiple of 128 (MaxText's and Megatron's padding agree there)."""
    if hidden % heads:
        raise ValueError(f"--hidden {hidden} is not a multiple of --heads {heads}")
    return LlamaSpec(
        vocab_size=-(-vocab_size // 128) * 128,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=llama_ffn(hidden),
        head_dim=hidden // heads,
        max_seq_len=max(256, seq_len + 1),
    )


def save_model(spec: ModelSpec, directory: Path, seed: int = 0) -> Path:
    """A randomly initialised fp32 model of ``spec`` (``LlamaForCausalLM``,
    ``Qwen3ForCausalLM`` or ``Qwen3MoeForCausalLM``, as ``transformers`` builds it from
    the spec's ``config.json``), with ``save_pretrained``."""
    try:
        import torch
        import transformers
    except ImportError as error:
        raise UsageError(
            f"building the model to compare needs torch and transformers ({error}): install "
            "baton-tools[export], or pass --init-from a Hugging Face model directory"
        ) from None
    fields = spec.to_hf_config()
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.float().save_pretrained(directory)
    return directory


def check_model(init_from: str, tokenizer_vocab: int) -> ModelSpec:
    """The spec of ``--init-from``; refused when it is no Hugging Face model directory or
    its vocabulary is smaller than the tokenizer's."""
    if not is_hf_dir(init_from):
        raise ValueError(
            f"--init-from {init_from} is not a Hugging Face model directory (config.json "
            "and *.safetensors, as save_pretrained writes them)"
        )
    spec = ModelSpec.from_hf(init_from)
    if spec.vocab_size < tokenizer_vocab:
        raise ValueError(
            f"--init-from {init_from} has {spec.vocab_size} vocabulary rows, the tokenizer "
            f"{tokenizer_vocab} ids; use a model built for this tokenizer"
        )
    return spec


def check_model_config(model_config: str, tokenizer_vocab: int) -> ModelSpec:
    """The spec of ``--model-config`` (a ``config.json`` or its directory); refused when
    its vocabulary is smaller than the tokenizer's."""
    spec = ModelSpec.from_hf(model_config)
    if spec.vocab_size < tokenizer_vocab:
        raise ValueError(
            f"--model-config {model_config} has vocab_size {spec.vocab_size}, the tokenizer "
            f"{tokenizer_vocab} ids; raise vocab_size to at least {tokenizer_vocab}"
        )
    return spec


def check_model_choice(
    init_from: str | None, model_config: str | None, shape: dict[str, int]
) -> None:
    """``ValueError`` (or ``UsageError``) for a model ``compare`` could not start from:
    both ``--init-from`` and ``--model-config``, or either one unreadable, or a bad shape."""
    if init_from is not None and model_config is not None:
        raise ValueError(
            "pass --init-from (weights to start from) or --model-config (a config.json to "
            "write random weights for), not both"
        )
    if init_from is not None:
        check_model(init_from, 0)
    elif model_config is not None:
        check_model_config(model_config, 0)
    else:
        tiny_llama_spec(**shape, vocab_size=1)


def starting_model(
    init_from: str | None,
    model_config: str | None,
    tokenizer: str,
    directory: Path,
    shape: dict[str, int],
) -> str:
    """``init_from``, or the model of ``model_config`` (else a tiny Llama of ``shape`` for
    the tokenizer) saved in ``directory``, checked against the tokenizer's vocabulary."""
    from baton.data import load_tokenizer

    tokenizer_vocab = load_tokenizer(tokenizer).vocab_size
    if init_from is None:
        if model_config is not None:
            spec = check_model_config(model_config, tokenizer_vocab)
        else:
            spec = tiny_llama_spec(**shape, vocab_size=tokenizer_vocab)
        init_from = str(save_model(spec, directory))
    spec = check_model(init_from, tokenizer_vocab)
    experts = "" if spec.moe is None else f", {spec.moe.num_experts} experts"
    print(
        f"model: {init_from} ({spec.family}, {spec.num_layers} layers, width "
        f"{spec.hidden_size}, {spec.num_heads} heads{experts}, vocabulary "
        f"{spec.vocab_size}); every backend starts there",
        flush=True,
    )
    return init_from
