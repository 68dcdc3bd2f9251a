"""The rollout phase of a Megatron-Core run that trains on rollouts (online RL: GRPO),
built by the recipe beside the backend and handed to the ``Driver``.

``megatron_rollout_phase`` checks the prompts the run reads (their kind, against the
objective's declaration, as every objective's data is checked), builds the phase with the
rollouts package's builder (``baton.backends.rollouts.phase.build_rollout_phase``) on the
backend's two collectives (``gather_weights``, ``broadcast``) and the run's settings, and
gives the backend the phase's current batch as its data (``rollout_rows.RolloutStream``).

- Rollouts per step: the global batch (``--batch-size`` x data-parallel ranks x
  micro-batches). The loss is normalised over the whole global batch (Megatron's
  per-token loss normalisation), so a group of completions may span micro-batches and
  data-parallel ranks: ``--num-generations`` need only divide the global batch.
- The policy's generator (on global rank 0) is a ``transformers`` model of the run's
  architecture: the ``--init-from`` Hugging Face directory, else a directory holding the
  ``config.json`` of the run's model spec (``--model-config``, or the spec a checkpoint
  recorded: the rollouts package's ``policy.policy_spec`` and ``policy.policy_directory``),
  its weights coming from ``gather_weights`` before the first sampling.
- The rows are the run's ``seq_len`` long, which must hold the longest prompt and
  completion (the phase refuses a shorter one, naming the ``--seq-len`` to pass).

Example (what ``recipes/megatron_gpt_tiny.py`` does with ``--objective grpo``)::

    spec = policy_spec(resolve_spec(model_config, init_from), init_from, run)
    use_spec(config, spec)                     # Hugging Face names for gather_weights
    backend = MegatronBackend(config)
    phase = megatron_rollout_phase(backend, init_from=init_from)
    Driver(backend, [*callbacks, RolloutRecords()], rollouts=phase, ...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.megatron.packed_data import check_data_objective
from baton.backends.rollouts.policy import (
    generator_device,
    policy_directory,
    policy_spec,
    spec_config,
)
from baton.core.launch import Launch

if TYPE_CHECKING:
    from baton.backends.megatron.backend import MegatronBackend
    from baton.backends.rollouts.phase import RolloutPhase


def megatron_rollout_phase(backend: MegatronBackend, *, init_from: str | None) -> RolloutPhase:
    """The rollout phase of ``backend``'s run (its config's objective trains on rollouts,
    its model is built from a spec: ``hf.use_spec``), whose current batch the backend's
    data stream reads from now on."""
    from baton.backends.rollouts.phase import build_rollout_phase
    from baton.data import load_tokenizer

    config = backend.config
    run = config.objective
    check_data_objective(config)  # prompts, one prefix, with their tokenizer
    assert config.data.data_path is not None and config.data.tokenizer is not None
    spec = config.spec or policy_spec(None, None, run)  # (the model's Hugging Face names)
    with policy_directory(init_from, run, spec_config(spec)) as policy:
        phase = build_rollout_phase(
            run.values,
            prompts=config.data.data_path,
            policy=policy,
            tokenizer=load_tokenizer(config.data.tokenizer),
            rows_per_step=config.global_batch_size,
            seed=config.seed,
            gather_weights=backend.gather_weights,
            broadcast=backend.broadcast,
            is_first_rank=Launch.from_env().rank == 0,
            seq_len=config.seq_len,
            device=generator_device(),
        )
    backend.rollouts = lambda: phase.current
    return phase
