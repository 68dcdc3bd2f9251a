"""An SFT or DPO run of a Hugging Face causal LM on the Fabric backend, from data packed
by ``baton data prepare --seq-len N``: the checks of the data, tokenizer and model, the
DPO reference's log-probabilities (computed once, stored beside the data), and the
loaders, losses and recorded settings a ``FabricBackend`` and ``Driver`` are built from.

The rows and losses themselves are ``posttrain.py``'s; this module puts them together
for a recipe (``recipes/hf_finetune.py --objective sft|dpo``).

Example::

    config = AutoConfig.from_pretrained("sft_export")
    run = post_training(
        "dpo", config, spec, data_path="data/pairs", tokenizer="sft_export",
        init_from="sft_export", reference=None, dpo_beta=0.1, dpo_loss="sigmoid",
        batch_size=8, seed=0, accelerator="cpu",
    )
    backend = FabricBackend(model, optimizer, run.train, eval_data=run.val,  # None: none held
                            loss_fn=run.loss_fn, mean_over=run.mean_over)
    Driver(backend, callbacks, settings=run.settings, training_settings=OBJECTIVE_SETTINGS)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from baton.backends.fabric.moe import RouterBalance
from baton.backends.fabric.posttrain import (
    DPOLoss,
    MoESFTLoss,
    PackedRows,
    pair_count,
    reference_logps,
    sft_loss,
    supervised_tokens,
)
from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec
from baton.data import DataError, load_tokenizer
from baton.data.packed import PackedDataset, check_objective, held_out_rows

#: the recorded settings of a post-training run that a resume may not change
OBJECTIVE_SETTINGS = frozenset({"objective", "dpo_beta", "dpo_loss", "reference_fingerprint"})


@dataclass(frozen=True)
class PostTraining:
    """What a post-training ``FabricBackend`` and its ``Driver`` are built from."""

    #: a resumable global order of packed rows (``GlobalBatches``)
    train: Any
    #: the held-out rows (``--eval-split``, ``--eval-data-path``) as batches, or None
    val: list[dict[str, torch.Tensor]] | None
    #: the objective's loss (``sft_loss`` or a ``DPOLoss``)
    loss_fn: Callable[..., Any]
    #: what the loss is a mean over in the global batch (supervised tokens or pairs)
    mean_over: Callable[[Any], int]
    #: settings to record besides the recipe's (DPO: the reference's fingerprint)
    settings: dict[str, Any] = field(default_factory=dict)
    #: metrics worth a place on the console line besides the loss (DPO: its rewards)
    console_keys: list[str] = field(default_factory=list)


def reference_device(accelerator: str) -> torch.device:
    """Where the reference log-probabilities are computed: this rank's GPU when the run
    trains on one, else the CPU."""
    if accelerator != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def dpo_reference_logps(
    data: PackedDataset,
    config: Any,
    source: str,
    *,
    pad_id: int,
    batch_rows: int,
    accelerator: str,
) -> tuple[Any, str]:
    """``(log-probabilities of every document under the reference, its fingerprint)``:
    read from beside the data when stored for this reference, else computed and stored.
    A reference of another architecture or tokenizer is refused."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from baton.backends.fabric.weights import load_weights
    from baton.backends.reference_logps import model_fingerprint, stored_or_computed

    tokenizer_fingerprint = data.manifest["tokenizer"]["fingerprint"]
    directory = Path(source)
    if (directory / "config.json").is_file():
        theirs = AutoConfig.from_pretrained(source)
        for name in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers"):
            if getattr(theirs, name, None) != getattr(config, name, None):
                raise UsageError(
                    f"--reference {source} has {name} {getattr(theirs, name, None)}, the "
                    f"model {getattr(config, name, None)}; give a reference of the same "
                    "architecture"
                )
    if (directory / "tokenizer.json").is_file():
        if load_tokenizer(directory).fingerprint != tokenizer_fingerprint:
            raise UsageError(
                f"--reference {source} has another tokenizer than the data "
                f"{data.prefix}; give a reference trained with the data's tokenizer"
            )
    fingerprint = model_fingerprint(source)

    def compute() -> Any:
        device = reference_device(accelerator)
        model = AutoModelForCausalLM.from_config(config)
        load_weights(model, source)
        return reference_logps(
            model.to(device), data, pad_id=pad_id, batch_rows=batch_rows, device=device
        )

    logps = stored_or_computed(
        data.prefix,
        fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint,
        engine="fabric",
        compute=compute,
        num_sequences=data.num_sequences,
    )
    return logps, fingerprint


def packed_loaders(
    data: PackedDataset,
    *,
    batch_size: int,
    seed: int,
    pad_id: int,
    reference: Any = None,
    held: PackedDataset | None = None,
    held_reference: Any = None,
) -> tuple[Any, list[dict[str, torch.Tensor]] | None]:
    """``(train, evaluation batches)``: ``GlobalBatches`` of every row of ``data`` (a
    resumable global order) and, when rows are held out (``held``: ``held_out_rows``),
    those rows in batches of ``batch_size``; nothing is held out unless asked."""
    from torch.utils.data import default_collate

    from baton.backends.fabric.elastic import GlobalBatches

    rows = PackedRows(data, pad_id, reference=reference)
    if len(rows) < batch_size:
        raise UsageError(
            f"{data.prefix} holds {len(rows)} rows to train on, too few for batches of "
            f"{batch_size}; use a smaller --batch-size or more data"
        )
    train = GlobalBatches(rows, batch_size=batch_size, seed=seed)
    if held is None:
        return train, None
    tail = PackedRows(held, pad_id, reference=held_reference)
    val = [
        default_collate([tail[i] for i in range(start, min(start + batch_size, len(tail)))])
        for start in range(0, len(tail), batch_size)
    ]
    return train, val


def post_training(
    objective: str,
    config: Any,
    spec: ModelSpec | None,
    *,
    data_path: str | None,
    tokenizer: str | None,
    init_from: str | None,
    reference: str | None,
    dpo_beta: float,
    dpo_loss: str,
    batch_size: int,
    seed: int,
    accelerator: str,
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
) -> PostTraining:
    """The ``objective`` (``sft`` or ``dpo``) run of the model of ``config`` (a
    ``transformers`` config; ``spec`` its model spec, if any) on the packed data at
    ``data_path``, prepared with ``tokenizer``; DPO's reference is ``reference`` or else
    ``init_from``. Rows are held out for evaluation only when asked: the last
    ``eval_split`` of them, or the prepared data at ``eval_data_path`` (``held_out_rows``).
    Bad input is a ``UsageError`` or ``DataError`` naming the fix."""
    from baton.backends.torch_objectives import DPO_LOSSES, DPO_METRICS

    if data_path is None or tokenizer is None:
        raise UsageError(
            f"--objective {objective} needs --data-path PREFIX (made by `baton data prepare "
            "... --seq-len N`) and --tokenizer DIR"
        )
    if objective == "dpo" and dpo_loss not in DPO_LOSSES:
        raise UsageError(f"--dpo-loss {dpo_loss!r}: use one of {', '.join(DPO_LOSSES)}")
    check_objective(data_path, objective)
    data = PackedDataset(data_path)
    info = load_tokenizer(tokenizer)
    if info.fingerprint != data.manifest["tokenizer"]["fingerprint"]:
        raise DataError(
            f"{data.prefix} was prepared with another tokenizer than {tokenizer}; pass the "
            "tokenizer the data was prepared with, or prepare the data again"
        )
    if config.vocab_size < info.vocab_size:
        raise UsageError(
            f"the data's vocabulary has {info.vocab_size} tokens, the model's only "
            f"{config.vocab_size}; use a model built for this tokenizer"
        )
    balance, moe_keys = None, []
    if spec is not None and spec.moe is not None:  # its load-balancing term, padding excluded
        balance = RouterBalance(config, aux_loss_coef=spec.moe.aux_loss_coef)
        moe_keys = ["moe/aux_loss", "moe/load_balance"]
    trained, held = held_out_rows(data, eval_split=eval_split, eval_data_path=eval_data_path)
    if objective == "sft":
        train, val = packed_loaders(
            trained, batch_size=batch_size, seed=seed, pad_id=info.eod_id, held=held
        )
        loss_fn = sft_loss if balance is None else MoESFTLoss(balance)
        return PostTraining(train, val, loss_fn, supervised_tokens, console_keys=moe_keys)
    source = reference or init_from
    if source is None:
        raise UsageError("--objective dpo needs --reference DIR or --init-from DIR")
    logps, fingerprint = dpo_reference_logps(
        data, config, source, pad_id=info.eod_id, batch_rows=batch_size, accelerator=accelerator
    )
    held_logps = logps  # held-out rows of the same data share its reference
    if held is not None and held.whole is not data:  # --eval-data-path: its own, stored beside it
        held_logps, _ = dpo_reference_logps(
            held, config, source, pad_id=info.eod_id, batch_rows=batch_size, accelerator=accelerator
        )
    train, val = packed_loaders(
        trained, batch_size=batch_size, seed=seed, pad_id=info.eod_id, reference=logps,
        held=held, held_reference=held_logps,
    )  # fmt: skip
    return PostTraining(
        train,
        val,
        DPOLoss(dpo_beta, dpo_loss, balance),
        pair_count,
        settings={"reference_fingerprint": fingerprint},
        console_keys=[name for name in DPO_METRICS if name.startswith("rewards/")] + moe_keys,
    )
