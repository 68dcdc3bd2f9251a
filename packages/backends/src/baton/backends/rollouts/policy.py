"""The policy the rollouts' generator runs, on every engine: its Hugging Face
architecture, the directory the generator is built from, and where it runs.

- ``policy_spec``: the run's architecture, ``--model-config`` or the ``--init-from``
  Hugging Face directory's, else the spec an ``--init-from`` checkpoint recorded
  (``recorded_policy_spec``, ``None`` when there is none); a run with none is refused.
- ``policy_directory``: while the phase is built, the ``--init-from`` Hugging Face
  directory when the run starts from one, else a temporary directory holding the
  architecture's ``config.json`` and no weights (written by the engine's
  ``write_config``, e.g. ``spec_config(spec)``), removed on exit: the generator's weights
  come from the backend's ``gather_weights``. A KL term's reference is the policy's directory unless
  ``--reference`` names one, so a run with ``--beta`` above 0 and no Hugging Face start
  must pass ``--reference``.
- ``generator_device``: global rank 0's accelerator for a torch engine, else the CPU.

Example::

    spec = policy_spec(resolve_spec(model_config, init_from), init_from, run)
    with policy_directory(init_from, run, spec_config(spec)) as policy:
        phase = build_rollout_phase(run.values, prompts=..., policy=policy, ...,
                                    device=generator_device())
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from baton.core.errors import UsageError
from baton.core.launch import Launch
from baton.core.model.spec import ModelSpec, is_hf_dir, recorded_spec
from baton.core.objectives import ObjectiveRun

#: writes the architecture's ``config.json`` (and what else the engine adds) into a folder
ConfigWriter = Callable[[Path], object]


def recorded_policy_spec(spec: ModelSpec | None, init_from: str | None) -> ModelSpec | None:
    """The run's model spec: ``spec`` (``--model-config`` or the ``--init-from`` Hugging
    Face directory's), else the one a baton checkpoint ``init_from`` recorded, else None."""
    if spec is not None or not init_from:
        return spec
    recorded = recorded_spec(init_from)
    return None if recorded is None else ModelSpec.from_dict(recorded)


def policy_spec(spec: ModelSpec | None, init_from: str | None, run: ObjectiveRun) -> ModelSpec:
    """The architecture the rollouts' generator runs (``recorded_policy_spec``);
    ``UsageError`` when the run has none."""
    found = recorded_policy_spec(spec, init_from)
    if found is None:
        raise UsageError(
            f"--objective {run.name} samples completions with a transformers model of the "
            "policy: start from --init-from HF_DIR, --model-config CONFIG, or a checkpoint "
            "of a run built from one"
        )
    return found


def spec_config(spec: ModelSpec) -> ConfigWriter:
    """A ``ConfigWriter`` of ``spec``'s Hugging Face ``config.json``, alone."""

    def write(directory: Path) -> None:
        config = directory / "config.json"
        config.write_text(json.dumps(spec.to_hf_config()), encoding="utf-8")

    return write


@contextmanager
def policy_directory(
    init_from: str | None, run: ObjectiveRun, write_config: ConfigWriter
) -> Iterator[Path]:
    """The policy's Hugging Face directory while the phase is built: ``init_from`` when
    it is one, else a temporary directory ``write_config`` fills (the weights come from
    the backend), removed on exit; a ``UsageError`` that ``write_config`` raises (an
    architecture with no Hugging Face form) comes first. A KL term's reference is the
    policy's directory unless ``--reference`` names one: without a Hugging Face start
    there is none to read."""
    if init_from is not None and is_hf_dir(init_from):
        yield Path(init_from)
        return
    with tempfile.TemporaryDirectory(prefix="baton-policy-") as directory:
        write_config(Path(directory))
        if run.values.get("beta") and not run.values.get("reference"):
            raise UsageError(
                f"--objective {run.name} with --beta above 0 scores the rollouts under a "
                "reference model: pass --reference HF_DIR (e.g. the starting checkpoint's "
                "`baton export --format hf`), or start from --init-from HF_DIR"
            )
        yield Path(directory)


def generator_device() -> str:
    """Where global rank 0's generator runs on a torch engine: its accelerator (the
    launch's local rank), else the CPU."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{Launch.from_env().local_rank}"
    return "cpu"
