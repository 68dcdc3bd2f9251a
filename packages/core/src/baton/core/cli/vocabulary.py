"""One vocabulary for every recipe: the same flag has the same meaning on every backend.

A recipe parameter whose meaning is listed here takes the listed name and type, so
``--batch-size 4 --tp 2 --save-every 100`` means the same thing whether the recipe runs
Lightning Fabric, TorchTitan, Megatron-Core or MaxText. The backend's own name for a
setting stays reachable through ``--set`` (``--set training.local_batch_size=4``,
``--set model.tensor_model_parallel_size=2``, ``--set ici_tensor_parallelism=2``).
``tests/core/test_vocabulary.py`` reads every recipe's signature and checks it against
this table; ``not_called`` lists the names recipes used before, which must not come
back. Bounds (``minimum``) are checked before the recipe runs.

Example::

    from baton.core.cli.vocabulary import TERMS, markdown_table

    TERMS["batch_size"].meaning   # "samples per step on each data-parallel rank ..."
    print(markdown_table())       # the docs' table, generated from this module
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from baton.core.objectives import OBJECTIVES, ObjectiveRun


@dataclasses.dataclass(frozen=True)
class Term:
    """A recipe parameter with one meaning on every backend."""

    name: str
    #: the type (``int | None`` is accepted where ``None`` means "derived")
    type: type
    meaning: str
    group: str
    #: the lowest accepted value (``None``: no bound beyond the type)
    minimum: float | None = None
    #: names recipes used for this meaning before (or frameworks use): not for recipes
    not_called: tuple[str, ...] = ()
    #: what 0 means, where it means something: a recipe's help says ``(0: <zero>``
    zero: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_GENERAL: tuple[Term, ...] = (
    # -- batch and sequence ---------------------------------------------------------
    Term(
        "batch_size",
        int,
        "samples (sequences) per forward/backward pass on each data-parallel rank: the micro batch",
        "batch",
        1,
        ("micro_batch_size", "per_device_batch_size", "local_batch_size", "micro_batch"),
    ),
    Term(
        "global_batch_size",
        int,
        "samples per optimizer step over all ranks (batch_size x data-parallel ranks x "
        "gradient accumulation)",
        "batch",
        1,
    ),
    Term(
        "grad_accum",
        int,
        "micro batches accumulated per optimizer step",
        "batch",
        1,
        ("gradient_accumulation_steps", "accumulate_grad_batches"),
    ),
    Term("seq_len", int, "tokens per sequence", "batch", 1, ("seq_length", "max_target_length")),
    # -- model -------------------------------------------------------------------------
    Term(
        "layers",
        int,
        "transformer blocks",
        "model",
        1,
        ("n_layer", "n_layers", "num_layers", "num_hidden_layers", "base_num_decoder_layers"),
    ),
    Term("d_model", int, "model width (hidden size)", "model", 1, ("hidden_size", "emb_dim")),
    Term(
        "heads",
        int,
        "attention heads",
        "model",
        1,
        ("n_head", "n_heads", "num_attention_heads", "base_num_query_heads"),
    ),
    Term("vocab_size", int, "tokens in the vocabulary (None: the tokenizer's)", "model", 1),
    Term(
        "model_config",
        str,
        "a Hugging Face config.json (or its directory) defining the model to build",
        "model",
    ),
    Term(
        "init_from",
        str,
        "a baton checkpoint or Hugging Face directory whose weights start the run",
        "model",
    ),
    # -- parallelism -----------------------------------------------------------------
    Term(
        "devices",
        int,
        "devices this process spans (MaxText and JAX: host devices, simulated on a CPU); "
        "the ranks a --dry-run plans for are the run flag --world-size",
        "parallel",
        1,
        ("gpus", "num_devices"),
    ),
    Term(
        "dp_replicate",
        int,
        "data-parallel replicas (each holds a full copy of what is not sharded)",
        "parallel",
        1,
        ("ici_data_parallelism", "data_parallel"),
    ),
    Term(
        "dp_shard",
        int,
        "data-parallel ranks that shard parameters and optimizer state (FSDP); -1: every "
        "device left over",
        "parallel",
        -1,
        ("ici_fsdp_parallelism", "fsdp"),
    ),
    Term(
        "tp",
        int,
        "tensor-parallel degree",
        "parallel",
        1,
        ("tensor_parallel", "ici_tensor_parallelism", "tensor_model_parallel_size"),
    ),
    Term(
        "pp",
        int,
        "pipeline-parallel stages",
        "parallel",
        1,
        ("pipeline_parallel", "ici_pipeline_parallelism", "pipeline_model_parallel_size"),
    ),
    Term(
        "vpp",
        int,
        "model chunks per pipeline stage (above 1: an interleaved schedule)",
        "parallel",
        1,
        ("virtual_pipeline", "virtual_pipeline_model_parallel_size"),
    ),
    Term(
        "cp",
        int,
        "context-parallel degree (the sequence split over ranks)",
        "parallel",
        1,
        ("context_parallel", "ici_context_parallelism"),
    ),
    Term(
        "ep",
        int,
        "expert-parallel degree",
        "parallel",
        1,
        ("expert_parallel", "ici_expert_parallelism"),
    ),
    Term(
        "capacity_factor",
        float,
        "tokens a mixture-of-experts expert takes, as a multiple of its even share; above "
        "it tokens drop (none: dropless)",
        "parallel",
        0,
        ("moe_expert_capacity_factor",),
    ),
    # -- optimizer and schedule ------------------------------------------------------
    Term("lr", float, "peak learning rate (after warmup)", "schedule", None, ("learning_rate",)),
    Term(
        "lr_schedule",
        str,
        "the learning rate after the warmup: constant, linear or cosine decay to --min-lr "
        "at --max-steps (None: the one the objective declares, the same on every engine: "
        "cosine for pretrain, constant for sft, dpo and grpo; baton.core.lr_schedule)",
        "schedule",
        None,
        ("lr_scheduler", "lr_decay_style", "lr_scheduler_type", "decay_style"),
    ),
    Term(
        "min_lr",
        float,
        "the learning rate a linear or cosine decay ends at, at --max-steps (None: --lr / 10)",
        "schedule",
        0,
    ),
    Term(
        "warmup_steps",
        int,
        "steps of linear warmup from 0 to --lr; 0: none (the default on every engine)",
        "schedule",
        0,
        ("lr_warmup_steps",),
        zero="none",
    ),
    Term(
        "grad_clip",
        float,
        "gradient norm clipping threshold; 0: no clipping",
        "schedule",
        0,
        zero="no clipping",
    ),
    # -- the run ---------------------------------------------------------------------
    Term("max_steps", int, "optimizer steps to train", "run", 0),
    Term("seed", int, "seed of the weights and of the data order", "run", 0),
    Term("run_dir", str, "where checkpoints, logs and run.json go", "run"),
    Term(
        "log_every",
        int,
        "steps between log lines (metrics reach the host only then); at least 1",
        "run",
    ),
    Term(
        "eval_every",
        int,
        "steps between evaluations; 0: no evaluation while training",
        "run",
        0,
        zero="none",
    ),
    Term(
        "save_every",
        int,
        "steps between checkpoints; 0: no periodic checkpoints, only the one written "
        "when the run stops",
        "run",
        0,
        ("checkpoint_period", "save_interval"),
        zero="only when the run stops",
    ),
    Term(
        "async_save",
        bool,
        "write checkpoints in the background (--no-async-save: in the training loop)",
        "run",
        None,
        ("async_checkpoint", "async_checkpointing"),
    ),
    Term(
        "progress",
        bool,
        "show the live progress bar (--no-progress: only log lines)",
        "run",
        None,
    ),
    Term(
        "dry_run",
        bool,
        "build and print the plan (native config, layout) without training",
        "run",
    ),
    # -- data ------------------------------------------------------------------------
    Term(
        "data_path",
        str,
        "training data: a UTF-8 text file trained on as bytes, or with --tokenizer a "
        "prepared dataset (baton data prepare), a blend, or text files",
        "data",
        None,
        ("text_path", "dataset_path", "train_data"),
    ),
    Term("eval_data_path", str, "evaluation data, of the same kind as --data-path", "data"),
    Term(
        "eval_split",
        float,
        "the fraction of the training data's documents (post-training: packed rows) held "
        "out for evaluation, the last ones; 0: none (nothing is held out unless asked)",
        "data",
        0,
        ("validation_split", "val_split", "holdout_fraction"),
        zero="none",
    ),
    Term(
        "tokenizer",
        str,
        "a Hugging Face tokenizer directory (baton data tokenizer)",
        "data",
        None,
        ("tokenizer_path",),
    ),
    Term("text_key", str, "the text field of .jsonl/.parquet records", "data"),
)


def _objective_terms() -> tuple[Term, ...]:
    """``--objective`` and every declared objective's settings, read from the declarations
    (``baton.core.objectives``): a recipe takes them as its one ``objective`` parameter."""
    from baton.core.cli.objective_flags import declared_settings

    terms = [
        Term(
            "objective",
            str,
            "what a step minimises: "
            + "; ".join(
                f"{name} ({OBJECTIVES.get(name).summary})"
                for name in OBJECTIVES.names(plugins=False)
            ),
            "objective",
            None,
            ("task", "training_type", "use_sft", "use_dpo"),
        )
    ]
    for setting, owners in declared_settings(plugins=False).values():
        terms.append(
            Term(
                setting.name,
                setting.type,
                f"({', '.join(owners)}) {setting.help}",
                "objective",
                None,
                setting.not_called,
            )
        )
    return tuple(terms)


#: every term: the general ones, then the objective and its settings
VOCABULARY: tuple[Term, ...] = _GENERAL + _objective_terms()

#: each term by its name
TERMS: dict[str, Term] = {term.name: term for term in VOCABULARY}
#: a name recipes must not use -> the vocabulary's name for its meaning
RENAMED: dict[str, str] = {old: term.name for term in VOCABULARY for old in term.not_called}


def base_type(annotation: Any) -> Any:
    """``int | None`` -> ``int``; ``Annotated[int, ...]`` -> ``int``; a recipe's
    ``ObjectiveRun | str`` -> ``str`` (its name on the command line); others as they are."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return base_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a not in (type(None), ObjectiveRun)]
        if len(rest) == 1:
            return base_type(rest[0])
    return annotation


def check_parameter(name: str, annotation: Any, help_text: str = "") -> str | None:
    """Why a recipe parameter (its name, type and docstring help) breaks the vocabulary,
    or ``None`` when it keeps it."""
    if name in RENAMED:
        term = TERMS[RENAMED[name]]
        return f"{name} means {term.flag} ({term.meaning}); name it {term.name}"
    term = TERMS.get(name)
    if term is None:
        return None
    if base_type(annotation) is not term.type:
        return f"{name} must be {term.type.__name__} (or {term.type.__name__} | None)"
    if term.zero is not None and f"(0: {term.zero}" not in help_text:
        return f"{name}: its help must say what 0 means as everywhere: '(0: {term.zero})'"
    return None


def markdown_table() -> str:
    """The vocabulary as a markdown table (flag, type, meaning, not called), by group."""
    rows = ["| flag | type | meaning | instead of |", "|---|---|---|---|"]
    for term in VOCABULARY:
        bound = "" if term.minimum is None else f", at least {term.minimum:g}"
        instead = ", ".join(f"`{n}`" for n in term.not_called)
        rows.append(f"| `{term.flag}` | {term.type.__name__}{bound} | {term.meaning} | {instead} |")
    return "\n".join(rows)
