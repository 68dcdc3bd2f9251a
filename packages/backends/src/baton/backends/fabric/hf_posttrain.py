"""A post-training run of a Hugging Face causal LM on the Fabric backend, for any
objective of ``baton.core.objectives`` that reads packed rows (``baton data prepare
--seq-len N``) or samples rollouts from prepared prompts: the checks of the data,
tokenizer and model, a stored reference's log-probabilities (computed once, stored
beside the data), and the loaders, loss and recorded settings a ``FabricBackend`` and
``Driver`` are built from.

An objective that samples rollouts (GRPO) trains on each step's rollouts: its training
data is ``rollout_rows.RolloutRows`` (the rollout phase's batch, which ``online_rl.py``
builds once the backend exists), with nothing held out for evaluation.

What the objective declares decides everything: the data it reads, whether it compares
with a reference (``ReferenceUse.STORED``), and its loss: the model's own cross entropy
where it declares ``native_cross_entropy`` (``posttrain.cross_entropy_loss``), else its
declared loss through ``objective_loss.ObjectiveLoss``, each on the run's cross-entropy
path (``cross_entropy.py``: chunked, fused or the full logits). The rows and losses themselves
are ``posttrain.py``'s and ``objective_loss.py``'s; this module puts them together for a
recipe (``recipes/hf_finetune.py --objective NAME``).

Example::

    config = AutoConfig.from_pretrained("sft_export")
    run = ObjectiveRun.of(objective)    # the recipe's --objective, with its settings
    post = post_training(
        run, config, spec, data_path="data/pairs", tokenizer="sft_export",
        init_from="sft_export", batch_size=8, seed=0, accelerator="cpu",
    )
    backend = FabricBackend(model, optimizer, post.train, eval_data=post.val,  # None: none held
                            loss_fn=post.loss_fn, mean_over=post.mean_over)
    Driver(backend, callbacks, settings=run.settings() | post.settings,
           training_settings=run.objective.fixed_on_resume)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from baton.backends.fabric.cross_entropy import FULL, CrossEntropy
from baton.backends.fabric.fast_paths import run_device
from baton.backends.fabric.moe import RouterBalance
from baton.backends.fabric.objective_loss import ObjectiveItems, ObjectiveLoss
from baton.backends.fabric.posttrain import (
    MoECrossEntropyLoss,
    PackedRows,
    cross_entropy_loss,
    reference_logps,
)
from baton.backends.fabric.rollout_rows import RolloutRows
from baton.backends.reference_logps import stored_or_computed
from baton.backends.reference_model import (
    check_reference,
    reference_fingerprint,
    reference_source,
)
from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec
from baton.core.objectives import ObjectiveRun, ReferenceUse
from baton.data import DataError, load_tokenizer
from baton.data.packed import PackedDataset, check_objective, held_out_rows
from baton.data.prompts import PreparedPrompts


@dataclass(frozen=True)
class PostTraining:
    """What a post-training ``FabricBackend`` and its ``Driver`` are built from."""

    #: a resumable global order of packed rows (``GlobalBatches``)
    train: Any
    #: the held-out rows (``--eval-split``, ``--eval-data-path``) as batches, or None
    val: list[dict[str, torch.Tensor]] | None
    #: the objective's loss (the model's own cross entropy, or an ``ObjectiveLoss``)
    loss_fn: Callable[..., Any]
    #: what the loss is a mean over in the global batch (``ObjectiveItems``)
    mean_over: Callable[[Any], int]
    #: settings to record besides the objective's (a stored reference's fingerprint)
    settings: dict[str, Any] = field(default_factory=dict[str, Any])
    #: metrics worth a place on the console line besides the loss
    console_keys: list[str] = field(default_factory=list[str])


def reference_device(accelerator: str) -> torch.device:
    """Where the reference log-probabilities are computed: this rank's GPU when the run
    trains on one, else the CPU."""
    if run_device(accelerator) == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def stored_reference(
    run: ObjectiveRun,
    data: PackedDataset,
    config: Any,
    spec: ModelSpec | None,
    *,
    init_from: str | None,
    pad_id: int,
    batch_rows: int,
    accelerator: str,
    cross_entropy: CrossEntropy = FULL,
) -> tuple[np.ndarray, str]:
    """``(log-probability of every document under the reference, its fingerprint)``: the
    reference is ``--reference``, else the starting weights; read from beside the data
    when stored for it, else computed with this model's forward and stored. A reference
    of another architecture or tokenizer is refused."""
    from transformers import AutoModelForCausalLM

    from baton.backends.fabric.weights import load_weights

    source = reference_source(run, init_from)
    if source is None:
        raise UsageError(
            f"--objective {run.name} compares with a reference model: pass --reference DIR "
            "or --init-from DIR"
        )
    tokenizer_fingerprint = data.manifest["tokenizer"]["fingerprint"]
    check_reference(source, spec, tokenizer_fingerprint, config=config.to_dict())
    fingerprint = reference_fingerprint(source)

    def compute() -> np.ndarray:
        device = reference_device(accelerator)
        model = AutoModelForCausalLM.from_config(config)
        load_weights(model, source)
        return reference_logps(
            model.to(device), data, pad_id=pad_id, batch_rows=batch_rows, device=device,
            cross_entropy=cross_entropy,
        )  # fmt: skip

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
    run: ObjectiveRun,
    config: Any,
    spec: ModelSpec | None,
    *,
    data_path: str | None,
    tokenizer: str | None,
    init_from: str | None,
    batch_size: int,
    seed: int,
    accelerator: str,
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
    cross_entropy: CrossEntropy = FULL,
) -> PostTraining:
    """``run``'s training of the model of ``config`` (a ``transformers`` config; ``spec``
    its model spec, if any) on the packed data (or, for an objective on rollouts, the
    prompts) at ``data_path``, prepared with ``tokenizer``; a stored reference is
    ``--reference`` or else ``init_from``. Rows are held out for evaluation only when
    asked: the last ``eval_split`` of them, or the prepared data at ``eval_data_path``
    (``held_out_rows``), evaluated by the same loss. Bad input is a ``UsageError`` or
    ``DataError`` naming the fix. ``cross_entropy``: how the loss and the stored
    reference's log-probabilities are computed (``cross_entropy.resolve_cross_entropy``)."""
    if data_path is None or tokenizer is None:
        raise UsageError(
            f"--objective {run.name} needs --data-path PREFIX (made by `baton data prepare "
            "... --seq-len N`) and --tokenizer DIR"
        )
    check_objective(data_path, run.name)
    info = load_tokenizer(tokenizer)
    # prompts (an objective on rollouts) are the rollout phase's to read
    data = None if run.objective.rollouts else PackedDataset(data_path)
    if data is None:
        PreparedPrompts(data_path).check_tokenizer(info)
    elif info.fingerprint != data.manifest["tokenizer"]["fingerprint"]:
        raise DataError(
            f"{data.prefix} was prepared with another tokenizer than {tokenizer}; pass the "
            "tokenizer the data was prepared with, or prepare the data again"
        )
    if config.vocab_size < info.vocab_size:
        raise UsageError(
            f"the data's vocabulary has {info.vocab_size} tokens, the model's only "
            f"{config.vocab_size}; use a model built for this tokenizer"
        )
    balance, keys = None, list(run.objective.console_keys)
    if spec is not None and spec.moe is not None:  # its load-balancing term, padding excluded
        balance = RouterBalance(config, aux_loss_coef=spec.moe.aux_loss_coef)
        keys += ["moe/aux_loss", "moe/load_balance"]
    if data is None:  # each step's rows: the rollout phase's batch (nothing held out)
        rows = RolloutRows(batch_size)
        loss = ObjectiveLoss(run, balance, cross_entropy)
        return PostTraining(rows, None, loss, ObjectiveItems(run), {}, keys)
    trained, held = held_out_rows(
        data, run.name, eval_split=eval_split, eval_data_path=eval_data_path
    )
    reference = held_reference = None
    settings: dict[str, Any] = {}
    if run.reference_use is ReferenceUse.STORED:
        reference, fingerprint = stored_reference(
            run, data, config, spec, init_from=init_from, pad_id=info.eod_id,
            batch_rows=batch_size, accelerator=accelerator, cross_entropy=cross_entropy,
        )  # fmt: skip
        settings["reference_fingerprint"] = fingerprint
        held_reference = reference  # held-out rows of the same data share its reference
        if held is not None and held.whole is not data:  # other data: its own, beside it
            held_reference, _ = stored_reference(
                run, held, config, spec, init_from=init_from, pad_id=info.eod_id,
                batch_rows=batch_size, accelerator=accelerator, cross_entropy=cross_entropy,
            )  # fmt: skip
    train, val = packed_loaders(
        trained, batch_size=batch_size, seed=seed, pad_id=info.eod_id, reference=reference,
        held=held, held_reference=held_reference,
    )  # fmt: skip
    if not run.objective.native_cross_entropy:
        loss_fn: Callable[..., Any] = ObjectiveLoss(run, balance, cross_entropy)
    elif balance is not None:
        loss_fn = MoECrossEntropyLoss(balance, cross_entropy)
    else:
        loss_fn = partial(cross_entropy_loss, cross_entropy=cross_entropy)
    return PostTraining(train, val, loss_fn, ObjectiveItems(run), settings, keys)
