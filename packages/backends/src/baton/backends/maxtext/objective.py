"""The checks of a MaxText run's objective, once, before MaxText builds anything: the data
is the kind its declaration reads, and its reference (if it compares the policy with one)
is the policy's architecture with the data's tokenizer. No jax.

An objective reading text (``DataKind.TEXT``) trains on a tokenized prefix or blend (or
bytes); one sampling its rows (``rollouts``: GRPO) on prepared prompts (``baton data
prepare PROMPTS.jsonl``), whose rollouts the rollout phase makes each step
(``rollout_batches``); every other one on one dataset prepared for it (``baton data
prepare ... --seq-len N``), fed by baton as MaxText batches (``packed_batches``). Any
other pairing is refused in one line naming the fix (a ``DataError``: exit status 2).

Example::

    run = ObjectiveRun.of("dpo")
    check_run_data(run, "data/pairs", "runs/tok", vocab_size=512, seq_len=128)
    settings |= checked_reference(run, config, spec)   # {"reference_fingerprint": ...}
"""

from __future__ import annotations

from typing import Any

from baton.backends.maxtext.config import MaxTextConfig
from baton.backends.maxtext.reference import reference_fingerprint
from baton.backends.reference_model import check_reference, reference_source
from baton.core.model.spec import ModelSpec
from baton.core.objectives import DataKind, ObjectiveRun, ReferenceUse
from baton.data import DataError, check_model_vocab, check_tokenizer, load_tokenizer
from baton.data.packed import check_objective, read_packed_manifest


def check_prepared_data(
    run: ObjectiveRun,
    data_path: str | None,
    tokenizer: str | None,
    vocab_size: int | None = None,
    seq_len: int | None = None,
) -> None:
    """``DataError`` unless ``data_path`` is one dataset prepared for ``run``'s objective
    (rows, or prompts for an objective sampling its rows) with ``tokenizer``, whose ids
    fit ``vocab_size`` embedding rows and whose rows fit ``seq_len`` tokens."""
    if not data_path or not tokenizer:
        made = (
            "`baton data prepare PROMPTS.jsonl --tokenizer DIR --output PREFIX`"
            if run.objective.rollouts
            else "`baton data prepare INPUT --tokenizer DIR --seq-len N --output PREFIX`"
        )
        raise DataError(
            f"--objective {run.name} trains on prepared data: pass --data-path PREFIX (from "
            f"{made}) and --tokenizer DIR"
        )
    if any(sep in data_path for sep in (",", ";", " ")):
        raise DataError(
            f"--objective {run.name} reads one prepared dataset, not a blend ({data_path!r}); "
            "prepare the sources together into one prefix"
        )
    check_objective(data_path, run.name)
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
    run: ObjectiveRun,
    data_path: str | None,
    tokenizer: str | None,
    vocab_size: int | None = None,
    seq_len: int | None = None,
) -> None:
    """The data of a run fits its objective: an objective reading text reads tokenized
    prefixes (or bytes), any other one dataset prepared for it (prompts for an objective
    sampling its rows, whose length the rollout phase checks against ``seq_len``)."""
    if run.objective.data is not DataKind.TEXT:
        check_prepared_data(run, data_path, tokenizer, vocab_size, seq_len)
        return
    if not data_path or not tokenizer:
        return  # text for the byte stream
    from baton.backends.maxtext.input_pipeline import is_hf_files, maxtext_mixture

    if not is_hf_files(data_path):
        for prefix in maxtext_mixture(data_path)[0]:
            check_objective(prefix, run.name)


def checked_reference(
    config: MaxTextConfig, spec: ModelSpec | None, tokenizer: str | None
) -> dict[str, Any]:
    """For an objective with a reference model: the reference checked against the policy
    (``spec``) and the data's ``tokenizer`` (``UsageError`` naming the fix), and its
    fingerprint as the run records it (``{"reference_fingerprint": ...}``); else ``{}``."""
    run = config.objective
    if run.reference_use is ReferenceUse.NONE:
        return {}
    source = reference_source(run, config.init_from)
    if source is not None:
        tokens = load_tokenizer(tokenizer).fingerprint if tokenizer else None
        check_reference(source, spec, tokens)
    return {"reference_fingerprint": reference_fingerprint(config)}
