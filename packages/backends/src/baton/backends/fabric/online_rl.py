"""The rollout phase of a Fabric run that trains on rollouts (online RL: GRPO), built by
the recipe beside the backend and handed to the ``Driver``.

``fabric_rollout_phase`` builds the phase with the rollouts package's builder
(``baton.backends.rollouts.phase.build_rollout_phase``) on the backend's two
collectives (``FabricBackend.gather_weights``, ``FabricBackend.broadcast``) and the run's
settings, and points the backend's data (``rollout_rows.RolloutRows``) at the phase's
current batch.

- Rollouts per step: ``--batch-size`` x ranks x ``--grad-accum`` (every Fabric rank is
  a data-parallel rank). The loss is a mean over the whole global batch, so a group of
  completions may span micro-batches and ranks: ``--num-generations`` need only divide
  the rollouts per step.
- The generator (on global rank 0, on its accelerator where the run has one) is a
  ``transformers`` model of the policy's architecture: the ``--init-from`` Hugging Face
  directory, else a temporary directory holding the run's ``config.json``
  (``--model-config`` with an ``--init-from`` checkpoint; the rollouts package's
  ``policy.policy_directory``), its weights coming from ``gather_weights`` before the
  first sampling.
- Rows are the run's ``--seq-len`` long, which must hold the longest prompt and
  completion (the phase refuses a shorter one, naming the ``--seq-len`` to pass).

Example (what ``recipes/hf_finetune.py`` does with ``--objective grpo``)::

    post = post_training(run, config, spec, data_path=..., ...)    # data: RolloutRows
    backend = FabricBackend(model, optimizer, post.train, loss_fn=post.loss_fn, ...)
    phase = fabric_rollout_phase(run, backend, post.train, config, data_path="data/prompts",
                                 tokenizer="sft_export", init_from="sft_export",
                                 seq_len=768, seed=0, accelerator="cpu")
    Driver(backend, [*callbacks, RolloutRecords()], rollouts=phase, ...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.backends.fabric.hf_posttrain import reference_device
from baton.backends.fabric.rollout_rows import RolloutRows
from baton.backends.rollouts.policy import policy_directory
from baton.core.launch import Launch
from baton.core.objectives import ObjectiveRun

if TYPE_CHECKING:
    from baton.backends.fabric.backend import FabricBackend
    from baton.backends.rollouts.phase import RolloutPhase


def fabric_rollout_phase(
    run: ObjectiveRun,
    backend: FabricBackend,
    rows: RolloutRows,
    config: Any,
    *,
    data_path: str,
    tokenizer: str,
    init_from: str | None,
    seq_len: int,
    seed: int,
    accelerator: str,
) -> RolloutPhase:
    """The rollout phase of ``backend``'s run (``config``: the model's ``transformers``
    config), whose current batch ``rows`` (the backend's data) reads from now on."""
    from baton.backends.rollouts.phase import build_rollout_phase
    from baton.data import load_tokenizer

    launch = Launch.from_env()
    with policy_directory(init_from, run, config.save_pretrained) as policy:
        phase = build_rollout_phase(
            run.values,
            prompts=data_path,
            policy=policy,
            tokenizer=load_tokenizer(tokenizer),
            rows_per_step=rows.batch_size * launch.world_size * backend.config.grad_accum,
            seed=seed,
            gather_weights=backend.gather_weights,
            broadcast=backend.broadcast,
            is_first_rank=launch.rank == 0,
            seq_len=seq_len,
            device=str(reference_device(accelerator)),
        )
    rows.read_from(lambda: phase.current)
    return phase
