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
  checkpoint recorded: ``policy_spec``); its weights come from the backend's
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

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from baton.backends.maxtext.config import MaxTextConfig
from baton.core.errors import UsageError
from baton.core.launch import Launch
from baton.core.model.spec import ModelSpec, is_hf_dir, recorded_spec
from baton.core.objectives import ObjectiveRun

if TYPE_CHECKING:
    from baton.backends.maxtext.backend import MaxTextBackend
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
    it is one, else a temporary directory with the ``config.json`` of ``spec`` (the
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
    with policy_directory(init_from, config.model_spec, run) as policy:
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
