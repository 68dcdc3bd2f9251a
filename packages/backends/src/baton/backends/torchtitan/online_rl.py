"""The rollout phase of a TorchTitan run whose objective samples rollouts each step
(online RL: GRPO), wired as the recipes wire it.

``titan_rollout_phase`` builds the phase with the rollouts package's builder
(``baton.backends.rollouts.phase.build_rollout_phase``) from the run's own facts:

- the prompts (``--data-path``) and the tokenizer they were prepared with;
- the policy's Hugging Face directory, whose config builds the generator's model (its
  weights come from the backend every time they change): ``--init-from`` when it is one;
  for a baton checkpoint or a ``--model-config`` start, a temporary directory holding the
  ``config.json`` of the run's model spec, removed once the phase is built (the rollouts
  package's ``policy.policy_directory``, filled by ``policy_config``). TorchTitan's own
  debug model has no Hugging Face form: such a run is refused;
- the rollouts a step trains on: TorchTitan's global batch (``--batch-size`` x
  data-parallel ranks x gradient accumulation, ``plan.rows_per_step``) on the launch's
  ranks, one rollout a row of ``training.seq_len`` tokens. ``--num-generations`` must
  divide it; a group's completions need not sit on one rank (the advantages are computed
  over the whole batch before it is shared out, and the loss is normalised over the
  global batch);
- the backend's collectives (``gather_weights``, ``broadcast``) and whether this process
  is global rank 0 (it samples), from the launch.

The backend reads each step's batch from the phase (``read_rollouts``).

Example::

    backend = TorchTitanBackend(config)
    phase = titan_rollout_phase(run, backend, data_path="data/prompts", tokenizer="tok/",
                                init_from="hf_models/sft", spec=spec, seed=0)
    Driver(backend, callbacks, rollouts=phase, max_steps=100).fit()
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from baton.backends.rollouts.policy import (
    ConfigWriter,
    generator_device,
    policy_directory,
    recorded_policy_spec,
)
from baton.core.errors import UsageError
from baton.core.launch import Launch
from baton.core.model.spec import ModelSpec
from baton.core.objectives import ObjectiveRun, ReferenceUse

if TYPE_CHECKING:
    from baton.backends.rollouts.phase import RolloutPhase
    from baton.backends.torchtitan.backend import TorchTitanBackend


def policy_config(
    run: ObjectiveRun, *, init_from: str | None, spec: ModelSpec | None, tokenizer: str
) -> ConfigWriter:
    """What fills the policy's temporary directory when the run does not start from a
    Hugging Face directory: the ``config.json`` of the run's spec (``spec``, else the one
    a checkpoint ``init_from`` recorded) with the tokenizer's special ids, and the
    ``generation_config.json`` of those ids. ``UsageError`` for TorchTitan's debug model
    (no Hugging Face form) and for a KL term, whose default reference (the starting
    weights) is only a Hugging Face directory's."""
    from baton.backends.hf_io import write_config

    def write(directory: Path) -> None:
        found = recorded_policy_spec(spec, init_from)
        if found is None:
            raise UsageError(
                f"--objective {run.name} samples completions with a transformers model of "
                "the policy, and TorchTitan's debug model has no Hugging Face form; start "
                "from --init-from HF_DIR (or a checkpoint of such a run) or --model-config "
                "CONFIG"
            )
        if run.reference_use is ReferenceUse.PER_ROLLOUT and not run.values.get("reference"):
            raise UsageError(
                f"--objective {run.name} scores rollouts with a reference model, by default "
                "the starting weights, which are only a Hugging Face directory's; pass "
                "--reference HF_DIR (for example `baton export` of the starting checkpoint)"
            )
        write_config(directory, found.to_hf_config(), tokenizer=tokenizer)

    return write


def titan_rollout_phase(
    run: ObjectiveRun,
    backend: TorchTitanBackend,
    *,
    data_path: str | None,
    tokenizer: str | None,
    init_from: str | None,
    spec: ModelSpec | None,
    seed: int,
) -> RolloutPhase:
    """The rollout phase of ``run`` on ``backend`` (see the module's text); the backend
    then reads each step's rollouts from it. ``UsageError``/``DataError`` (one line) for
    what does not fit: no prompts or tokenizer, no Hugging Face form of the policy, rows
    too short, ``--num-generations`` not dividing the rollouts of a step."""
    from baton.backends.rollouts.phase import build_rollout_phase
    from baton.backends.torchtitan.plan import rows_per_step
    from baton.data import load_tokenizer

    if data_path is None or tokenizer is None:
        raise UsageError(
            f"--objective {run.name} samples completions of prompts prepared by `baton data "
            "prepare PROMPTS.jsonl --tokenizer DIR --output PREFIX`; pass --data-path PREFIX "
            "and --tokenizer DIR"
        )
    config = backend.config
    launch = Launch.from_env()
    write = policy_config(run, init_from=init_from, spec=spec, tokenizer=tokenizer)
    with policy_directory(init_from, run, write) as policy:
        phase = build_rollout_phase(
            run.values,
            prompts=data_path,
            policy=policy,
            tokenizer=load_tokenizer(tokenizer),
            rows_per_step=rows_per_step(config, launch.world_size),
            seed=seed,
            gather_weights=backend.gather_weights,
            broadcast=backend.broadcast,
            is_first_rank=launch.rank == 0,
            seq_len=int(config.training.seq_len),
            device=generator_device(),
        )
    backend.read_rollouts(lambda: phase.current)
    return phase
