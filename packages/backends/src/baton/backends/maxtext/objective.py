"""The training objective's checks, before MaxText builds anything: the data fits it.

``--objective pretrain`` reads pretraining text; ``sft`` a prepared conversation dataset;
``dpo`` prepared preference pairs (``baton data prepare ... --seq-len N``). Any other
pairing is refused in one line naming the fix (a ``DataError``: exit status 2). No jax.

Example::

    check_post_training_data("sft", "data/chat", "runs/tok")   # DataError if it is not SFT data
    check_objective_settings("dpo", "ipo", 0.1)
"""

from __future__ import annotations

from pathlib import Path

from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec, first_difference, is_hf_dir
from baton.data import DataError, check_model_vocab, check_tokenizer, load_tokenizer
from baton.data.packed import check_objective, read_packed_manifest

#: the objectives the MaxText backend trains
OBJECTIVES = ("pretrain", "sft", "dpo")
#: DPO's losses (TRL's ``loss_type`` names)
DPO_LOSSES = ("sigmoid", "ipo")


def check_objective_settings(objective: str, dpo_loss: str, dpo_beta: float) -> None:
    """``UsageError`` for an unknown objective or DPO loss, or a beta that is not positive."""
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective {objective}: use one of {', '.join(OBJECTIVES)}")
    if objective == "dpo" and dpo_loss not in DPO_LOSSES:
        raise UsageError(f"--dpo-loss {dpo_loss}: use one of {', '.join(DPO_LOSSES)}")
    if objective == "dpo" and not dpo_beta > 0:
        raise UsageError(f"--dpo-beta {dpo_beta}: DPO's beta must be positive (e.g. 0.1)")


def check_post_training_data(
    objective: str,
    data_path: str | None,
    tokenizer: str | None,
    vocab_size: int | None = None,
    seq_len: int | None = None,
) -> None:
    """``DataError`` unless ``data_path`` is one prepared dataset for ``objective`` (``sft``
    or ``dpo``) made with ``tokenizer``, whose ids fit ``vocab_size`` embedding rows and
    whose rows fit ``seq_len`` tokens."""
    if not data_path or not tokenizer:
        raise DataError(
            f"--objective {objective} trains on prepared data: pass --data-path PREFIX (from "
            "`baton data prepare INPUT --tokenizer DIR --seq-len N --output PREFIX`) and "
            "--tokenizer DIR"
        )
    if any(sep in data_path for sep in (",", ";", " ")):
        raise DataError(
            f"--objective {objective} reads one prepared dataset, not a blend ({data_path!r}); "
            "prepare the sources together into one prefix"
        )
    check_objective(data_path, objective)
    info = load_tokenizer(tokenizer)
    check_tokenizer(data_path, info)
    if vocab_size is not None:
        check_model_vocab(info, int(vocab_size))
    rows = int((read_packed_manifest(data_path) or {}).get("seq_len", 0))
    if seq_len is not None and rows > seq_len:
        raise DataError(
            f"{data_path} holds rows of {rows} tokens, more than --seq-len {seq_len}; "
            f"pass --seq-len {rows}"
        )


def check_run_data(
    objective: str,
    data_path: str | None,
    tokenizer: str | None,
    vocab_size: int | None = None,
    seq_len: int | None = None,
) -> None:
    """The data of a run fits its objective: a pretraining run on tokenized data reads no
    post-training prefix; an SFT or DPO run reads one prepared dataset of its kind."""
    if objective != "pretrain":
        check_post_training_data(objective, data_path, tokenizer, vocab_size, seq_len)
        return
    if not data_path or not tokenizer:
        return  # text for the byte stream
    from baton.backends.maxtext.input_pipeline import is_hf_files, maxtext_mixture

    if not is_hf_files(data_path):
        for prefix in maxtext_mixture(data_path)[0]:
            check_objective(prefix, "pretrain")


def check_reference(reference: str | None, spec: ModelSpec | None, tokenizer: str | None) -> None:
    """``UsageError`` if a Hugging Face reference model differs from the run's model
    (``spec``, from --init-from or --model-config) in architecture, or ships another
    tokenizer than the run's."""
    if reference is None or not is_hf_dir(reference):
        return
    field = (
        None
        if spec is None
        else first_difference(ModelSpec.from_hf(reference).to_dict(), spec.to_dict())
    )
    if field is not None:
        raise UsageError(
            f"--reference {reference} is another model than the one trained (its {field} "
            "differs); pass a reference of the same architecture and tokenizer"
        )
    theirs = Path(reference) / "tokenizer.json"
    if (
        tokenizer
        and theirs.is_file()
        and load_tokenizer(reference).fingerprint != load_tokenizer(tokenizer).fingerprint
    ):
        raise UsageError(
            f"--reference {reference} has another tokenizer than --tokenizer {tokenizer}; "
            "pass a reference trained with the run's tokenizer"
        )
