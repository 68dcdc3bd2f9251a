"""What a TorchTitan run minimises: pretraining, supervised fine-tuning or DPO.

``use_objective`` sets a ``Trainer.Config`` for the vocabulary's ``objective``, after
checking the data fits it (before anything is built: one ``DataError`` line, exit 2):

- ``pretrain``: the config as it is (the data must not be post-training rows);
- ``sft``: the packed rows through ``PackedDataLoader`` (labels at TorchTitan's ignore
  index outside the supervised tokens, positions restarting per document). TorchTitan's
  own cross-entropy sums over the supervised tokens and ``Trainer.train_step`` divides by
  ``global_valid_tokens``, the supervised tokens of every micro-batch and data-parallel
  rank of the step: the loss is their global mean;
- ``dpo``: the pairs with their documents, and ``dpo.DpoLoss`` as TorchTitan's loss
  function (the reference log-probabilities are computed before the first step), run
  eagerly: TorchTitan's CUDA graphs (on by default on a GPU) are turned off, since the
  loss takes each micro-batch's documents from ``PairFeed`` in Python.

``check_reference`` refuses a DPO reference of another architecture or tokenizer.

Example::

    config = llama3_debug(seq_len=96, tokenizer="tok/")
    use_objective(config, "sft", "data/chat")
    check_reference("ref-model/", spec, "data/pairs")   # before a DPO run is built
"""

from __future__ import annotations

from typing import Any

from baton.core.errors import UsageError
from baton.core.model.spec import (
    ModelSpec,
    check_same_architecture,
    is_hf_dir,
    recorded_spec,
)
from baton.data.manifest import split_prefix
from baton.data.packed import check_objective

#: the objectives of the vocabulary's ``objective`` term
OBJECTIVES = ("pretrain", "sft", "dpo")
#: DPO's losses (TRL's ``loss_type`` names)
DPO_LOSSES = ("sigmoid", "ipo")


def check_run_objective(objective: str, data_path: str | None) -> None:
    """Refuse an objective the data does not fit (``DataError``/``UsageError``, one line)."""
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    if data_path is None:
        if objective != "pretrain":
            raise UsageError(
                f"--objective {objective} trains on data prepared by `baton data prepare "
                "... --seq-len N`; pass its prefix with --data-path"
            )
        return
    check_objective(data_path, objective)


def use_objective(
    config: Any,
    objective: str,
    data_path: str | None,
    *,
    dpo_beta: float = 0.1,
    dpo_loss: str = "sigmoid",
) -> None:
    """Set ``config`` (TorchTitan's ``Trainer.Config``) up for ``objective`` on
    ``data_path``; refuses data of another objective first."""
    check_run_objective(objective, data_path)
    if objective == "pretrain" or data_path is None:
        return
    from baton.backends.torchtitan.packed import PackedDataLoader
    from baton.data.packed import PackedDataset

    packed = PackedDataset(data_path)
    if packed.seq_len != config.training.seq_len:
        raise UsageError(
            f"{packed.prefix} was packed into rows of {packed.seq_len} tokens but the run's "
            f"sequence length is {config.training.seq_len}; pass --seq-len {packed.seq_len}"
        )
    config.dataloader = PackedDataLoader.Config(
        dataset_path=split_prefix(data_path), documents=objective == "dpo"
    )
    if objective == "dpo":
        if dpo_loss not in DPO_LOSSES:
            raise UsageError(f"--dpo-loss {dpo_loss!r}: use one of {', '.join(DPO_LOSSES)}")
        if dpo_beta <= 0:
            raise UsageError(f"--dpo-beta {dpo_beta}: must be positive")
        from baton.backends.torchtitan.dpo import DpoLoss

        config.loss = DpoLoss.Config(beta=dpo_beta, loss_type=dpo_loss)
        # the loss reads each micro-batch's documents beside the batch (PairFeed), which
        # a replayed CUDA graph of TorchTitan's forward-backward would not see
        config.training.disable_cuda_graphs = True


def check_reference(reference: str | None, spec: ModelSpec | None, data_path: str | None) -> None:
    """Refuse a DPO ``--reference`` that is missing, of another architecture than the
    policy's ``spec`` (a Hugging Face directory's ``config.json`` or a checkpoint's
    recorded spec), or whose tokenizer files differ from the data's tokenizer."""
    if reference is None:
        return
    from pathlib import Path

    if not Path(reference).is_dir():
        raise UsageError(
            f"--reference {reference} is not a directory; pass a Hugging Face model "
            "directory or a baton checkpoint"
        )
    what = f"--reference {reference}"
    hf = is_hf_dir(reference)
    saved = ModelSpec.from_hf(reference).to_dict() if hf else recorded_spec(reference)
    check_same_architecture(saved, spec.to_dict() if spec is not None else None, what=what)
    if hf and data_path is not None and (Path(reference) / "tokenizer.json").is_file():
        from baton.data import load_tokenizer
        from baton.data.packed import PackedDataset

        expected = PackedDataset(data_path).manifest.get("tokenizer", {}).get("fingerprint")
        if expected and load_tokenizer(reference).fingerprint != expected:
            raise UsageError(
                f"{what} carries another tokenizer than the one {data_path} was prepared "
                "with; pass a reference trained with the data's tokenizer"
            )


#: the settings of a post-training run a resume must not change
OBJECTIVE_SETTINGS = frozenset({"objective", "dpo_beta", "dpo_loss", "reference_fingerprint"})


def reference_fingerprint(
    objective: str, reference: str | None, init_from: str | None
) -> str | None:
    """The fingerprint of a DPO run's reference weights (``--reference``, else the
    starting weights of ``--init-from``; None for other objectives or a fresh
    initialisation): recorded in the run's settings, so a resume with other reference
    weights is refused, and the name of the stored log-probabilities."""
    source = reference or init_from
    if objective != "dpo" or source is None:
        return None
    from baton.backends.reference_logps import model_fingerprint

    return model_fingerprint(source)
