"""The rollout phase of a MaxText run that trains on rollouts (an objective that samples
its rows: GRPO), built by the recipe before anything is written and handed to the
``Driver``; the backend's data stream reads its current batch (``rollout_batches``).

- Rollouts per step: MaxText's global batch, ``per_device_batch_size`` x devices x
  ``gradient_accumulation_steps`` (``rollouts_per_step``; the devices: ``--devices``,
  else one per process, a JAX CPU host's; the backend's setup compares it with the
  global batch MaxText computes and refuses another). ``--num-generations`` need only
  divide it: the loss is one mean over the global batch's items, so a group of
  completions may span devices and micro-batches (MaxText needs no whole groups per
  device).
- The generator (on process 0) is a ``transformers`` model of the policy's
  architecture: the ``--init-from`` Hugging Face directory, else a temporary directory
  holding the ``config.json`` of the run's spec (``--model-config``, or the spec a
  checkpoint recorded: the rollouts package's ``policy.policy_spec`` and
  ``policy.policy_directory``); its weights come from the backend's
  ``gather_weights`` before the first sampling. It runs on the CPU (JAX holds the
  accelerators' memory), seeded by the run's data seed, like the prompt order.
- The rows are the run's ``--seq-len`` long (MaxText's ``max_target_length``), which must
  hold the longest prompt and completion (the phase refuses a shorter one, naming the
  ``--seq-len`` to pass).

Example (what ``recipes/maxtext_tiny.py`` does with ``--objective grpo``)::

    spec = policy_spec(resolve_spec(model_config, init_from), init_from, run)
    backend = MaxTextBackend(config)               # config.model_spec = spec
    phase = maxtext_rollout_phase(backend, init_from=init_from, devices=devices)
    Driver(backend, [*callbacks, RolloutRecords()], rollouts=phase, ...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.maxtext.config import MaxTextConfig
from baton.backends.rollouts.policy import policy_directory, spec_config
from baton.core.errors import UsageError
from baton.core.launch import Launch

if TYPE_CHECKING:
    from baton.backends.maxtext.backend import MaxTextBackend
    from baton.backends.rollouts.phase import RolloutPhase


def rollouts_per_step(config: MaxTextConfig, devices: int | None) -> int:
    """MaxText's global batch for ``config``'s overrides on ``devices`` devices (``None``:
    one per process): ``per_device_batch_size`` x devices x gradient accumulation.
    ``UsageError`` for a per-device batch that is a fraction (MaxText would load rows it
    does not train on)."""
    per_device = float(config.get("per_device_batch_size", 1))
    if not per_device.is_integer():
        raise UsageError(
            f"--objective {config.objective.name} trains on every rollout it samples: make "
            f"--batch-size a multiple of --tp (a per-device batch of {per_device:g} rows "
            "leaves rows untrained)"
        )
    count = devices or Launch.from_env().world_size
    return int(per_device) * count * int(config.get("gradient_accumulation_steps", 1))


def maxtext_rollout_phase(
    backend: MaxTextBackend, *, init_from: str | None, devices: int | None
) -> RolloutPhase:
    """The rollout phase of ``backend``'s run (its config's objective trains on rollouts,
    its data and tokenizer checked, its ``model_spec`` set), whose current batch the
    backend's data stream reads from now on."""
    from baton.backends.rollouts.phase import build_rollout_phase
    from baton.data import load_tokenizer

    config = backend.config
    run = config.objective
    if config.data_path is None or config.tokenizer is None or config.model_spec is None:
        raise ValueError("check the run's prompts and architecture before building the phase")
    with policy_directory(init_from, run, spec_config(config.model_spec)) as policy:
        phase = build_rollout_phase(
            run.values,
            prompts=config.data_path,
            policy=policy,
            tokenizer=load_tokenizer(config.tokenizer),
            rows_per_step=rollouts_per_step(config, devices),
            seed=config.data_seed,
            gather_weights=backend.gather_weights,
            broadcast=backend.broadcast,
            is_first_rank=Launch.from_env().rank == 0,
            seq_len=int(config["max_target_length"]),
            device="cpu",
        )
    backend.rollouts = phase
    return phase
