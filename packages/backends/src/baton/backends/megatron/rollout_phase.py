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
  recorded), its weights coming from ``gather_weights`` before the first sampling.
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

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from baton.backends.megatron.packed_data import check_data_objective
from baton.core.errors import UsageError
from baton.core.launch import Launch
from baton.core.model.spec import ModelSpec, is_hf_dir, recorded_spec
from baton.core.objectives import ObjectiveRun

if TYPE_CHECKING:
    from baton.backends.megatron.backend import MegatronBackend
    from baton.backends.rollouts.phase import RolloutPhase


def policy_spec(spec: ModelSpec | None, init_from: str | None, run: ObjectiveRun) -> ModelSpec:
    """The architecture the rollouts' generator runs: ``spec`` (``--model-config`` or the
    ``--init-from`` Hugging Face directory's), else the spec an ``--init-from`` checkpoint
    recorded; ``UsageError`` when the run has none."""
    if spec is not None:
        return spec
    recorded = recorded_spec(init_from) if init_from else None
    if recorded is None:
        raise UsageError(
            f"--objective {run.name} samples completions with a transformers model of the "
            "policy: start from --init-from HF_DIR, --model-config CONFIG, or a checkpoint "
            "of a run built from one"
        )
    return ModelSpec.from_dict(recorded)


@contextmanager
def policy_directory(init_from: str | None, spec: ModelSpec, run: ObjectiveRun) -> Iterator[Path]:
    """The policy's Hugging Face directory while the phase is built: ``init_from`` when
    it is one, else a temporary directory with the ``config.json`` of ``spec`` (its
    weights come from the backend). A KL term's reference is the policy's directory unless
    ``--reference`` names one: without a Hugging Face start there is none to read."""
    if init_from is not None and is_hf_dir(init_from):
        yield Path(init_from)
        return
    if run.values.get("beta") and not run.values.get("reference"):
        raise UsageError(
            f"--objective {run.name} with --beta above 0 scores the rollouts under a "
            "reference model: pass --reference HF_DIR (e.g. the starting checkpoint's "
            "`baton export --format hf`), or start from --init-from HF_DIR"
        )
    with tempfile.TemporaryDirectory(prefix="baton-policy-") as directory:
        config = Path(directory) / "config.json"
        config.write_text(json.dumps(spec.to_hf_config()), encoding="utf-8")
        yield Path(directory)


def generator_device() -> str:
    """Where global rank 0's generator runs: its accelerator, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{Launch.from_env().local_rank}"
    return "cpu"


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
    with policy_directory(init_from, spec, run) as policy:
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
