"""What a TorchTitan run minimises, from the objective's declaration
(``baton.core.objectives``): ``use_objective`` sets a ``Trainer.Config`` up for an
``ObjectiveRun``, after checking the data is the kind the objective reads (before anything
is built: one ``DataError``/``UsageError`` line, exit 2).

- Pretraining text (``DataKind.TEXT``): the config as it is.
- Packed rows (``baton data prepare --seq-len N``) go through ``PackedDataLoader``
  (labels at TorchTitan's ignore index outside the supervised tokens, positions
  restarting per document). An objective that is its engine's own cross entropy
  (``native_cross_entropy``: SFT) keeps TorchTitan's loss: its cross entropy sums over
  the supervised tokens and ``Trainer.train_step`` divides by ``global_valid_tokens``, the
  supervised tokens of every micro-batch and data-parallel rank of the step, so the loss
  is their global mean.
- Any other objective (DPO, a package's own) trains through its declared loss:
  ``objective_loss.ObjectiveLoss`` as TorchTitan's loss function, the rows' documents
  beside each batch. It runs eagerly: TorchTitan's CUDA graphs (on by default on a GPU)
  are turned off, since the loss takes each micro-batch's rows from Python.
- An objective that samples rollouts each step (``rollouts``: GRPO) reads prompts
  (``--data-path``, checked to be prompts) through the rollout phase, not a data loader
  over them: ``rollout_rows.RolloutDataLoader`` hands ``Trainer.train_step`` this rank's
  share of each step's rollouts, to the same ``ObjectiveLoss``.

``reference_settings`` checks an objective's reference model (``--reference``, else the
starting weights) once, before the build, and gives its fingerprint to record.

Example::

    run = ObjectiveRun.of("dpo", dpo_beta=0.1)
    config = llama3_debug(seq_len=96, tokenizer="tok/")
    use_objective(config, run, "data/pairs")
    settings |= reference_settings(run, init_from="hf-model/", spec=spec, data_path="data/pairs")
"""

from __future__ import annotations

from typing import Any

from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec
from baton.core.objectives import DataKind, ObjectiveRun, ReferenceUse
from baton.data.manifest import split_prefix
from baton.data.packed import check_objective


def reads_text(run: ObjectiveRun) -> bool:
    """Whether ``run`` trains on pretraining text (TorchTitan's own data loaders)."""
    return run.objective.data is DataKind.TEXT


def check_run_objective(run: ObjectiveRun, data_path: str | None) -> None:
    """Refuse an objective the data does not fit (``DataError``/``UsageError``, one
    line)."""
    if data_path is None:
        if not reads_text(run):
            raise UsageError(
                f"--objective {run.name} trains on {run.objective.data.described} prepared "
                "by `baton data prepare ... --seq-len N`; pass its prefix with --data-path"
            )
        return
    check_objective(data_path, run.name)


def use_objective(config: Any, run: ObjectiveRun, data_path: str | None) -> None:
    """Set ``config`` (TorchTitan's ``Trainer.Config``) up for ``run`` on ``data_path``;
    refuses data of another kind first."""
    check_run_objective(run, data_path)
    if reads_text(run) or data_path is None:
        return
    if run.objective.rollouts:  # the rollout phase reads the prompts
        from baton.backends.torchtitan.objective_loss import ObjectiveLoss
        from baton.backends.torchtitan.rollout_rows import RolloutDataLoader

        config.dataloader = RolloutDataLoader.Config()
        config.loss = ObjectiveLoss.Config(run=run)
        config.training.disable_cuda_graphs = True
        return
    from baton.backends.torchtitan.packed import PackedDataLoader
    from baton.data.packed import PackedDataset

    packed = PackedDataset(data_path)
    if packed.seq_len != config.training.seq_len:
        raise UsageError(
            f"{packed.prefix} was packed into rows of {packed.seq_len} tokens but the run's "
            f"sequence length is {config.training.seq_len}; pass --seq-len {packed.seq_len}"
        )
    native = run.objective.native_cross_entropy
    config.dataloader = PackedDataLoader.Config(
        dataset_path=split_prefix(data_path), documents=not native
    )
    if native:
        return
    from baton.backends.torchtitan.objective_loss import ObjectiveLoss

    config.loss = ObjectiveLoss.Config(run=run)
    # the loss reads each micro-batch's rows beside the batch (RowFeed), which a
    # replayed CUDA graph of TorchTitan's forward-backward would not see
    config.training.disable_cuda_graphs = True


def reference_settings(
    run: ObjectiveRun, *, init_from: str | None, spec: ModelSpec | None, data_path: str | None
) -> dict[str, str]:
    """``{"reference_fingerprint": ...}`` of ``run``'s reference model (``--reference``,
    else the starting weights ``init_from``) after checking it is the policy's
    architecture (``spec``) and reads the data's tokenizer (``UsageError``, one line);
    empty for an objective without a reference, or a reference that is a random start
    (the backend fingerprints it by its seed and shapes)."""
    if run.reference_use is ReferenceUse.NONE:
        return {}
    from baton.backends.reference_model import (
        check_reference,
        reference_fingerprint,
        reference_source,
    )

    source = reference_source(run, init_from)
    if source is None:
        return {}
    tokenizer = None
    if data_path is not None:  # the tokenizer the data (rows or prompts) was prepared with
        from baton.data.packed import read_packed_manifest

        manifest = read_packed_manifest(data_path) or {}
        tokenizer = manifest.get("tokenizer", {}).get("fingerprint")
    check_reference(source, spec, tokenizer)
    return {"reference_fingerprint": reference_fingerprint(source)}
