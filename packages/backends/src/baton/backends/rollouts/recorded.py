"""A generator that replays recorded rollouts: the completions a rollouts file holds
(``logs/rollouts.jsonl`` of another run, or a file written to fix a batch), each with its
sampling log-probabilities, given back for the prompts they were sampled for.

It implements the same ``Generator`` seam as ``TransformersGenerator``, so any engine's
GRPO run can train on exactly the completions another run (or another engine, or TRL)
trained on: ``--generator recorded:FILE.jsonl``. For each prompt it is asked for, it gives
the next record of that prompt (by its token ids) not given yet, in the file's order; a
prompt the file holds no more completions of is refused, naming it. Weights it is handed
are only counted (the completions are already sampled).

Example::

    generator = RecordedGenerator("runs/grpo/logs/rollouts.jsonl")
    completions = generator.generate([prompt_ids] * 4, sampling)   # the file's 4 of it
    generator.state_dict()        # {"given": [0, 1, 2, 3]}: resumable
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from baton.core.errors import UsageError
from baton.core.rollouts.generator import Completion, Sampling

#: the ``--generator`` value that names a file to replay: ``recorded:FILE.jsonl``
PREFIX = "recorded:"


class RecordedGenerator:
    """Completions replayed from a rollouts file (see the module's text)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(
                f"--generator {PREFIX}{path}: no such file; give a rollouts file (a run's "
                "logs/rollouts.jsonl)"
            )
        self.records: list[dict[str, Any]] = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                ids, logps = record["completion_ids"], record["logps"]
                record["prompt_ids"] = tuple(record["prompt_ids"])
            except (ValueError, KeyError, TypeError) as error:
                raise UsageError(
                    f"{self.path}:{number} is not a rollout record with prompt_ids, "
                    f"completion_ids and logps ({error}); give a rollouts file written by baton"
                ) from None
            if len(ids) != len(logps):
                raise UsageError(
                    f"{self.path}:{number}: {len(ids)} completion ids but {len(logps)} logps"
                )
            self.records.append(record)
        self._given: set[int] = set()
        self._version: int | None = None

    @property
    def version(self) -> int | None:
        return self._version

    def load_weights(self, weights: Mapping[str, Any], version: int) -> None:
        self._version = version

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling) -> list[Completion]:
        out: list[Completion] = []
        for prompt in prompts:
            key = tuple(int(i) for i in prompt)
            index = next(
                (
                    i
                    for i, record in enumerate(self.records)
                    if i not in self._given and record["prompt_ids"] == key
                ),
                None,
            )
            if index is None:
                raise UsageError(
                    f"--generator {PREFIX}{self.path} holds no more completions of the prompt "
                    f"{list(key)[:12]}...; record more rollouts, or train fewer steps"
                )
            self._given.add(index)
            record = self.records[index]
            out.append(
                Completion(
                    ids=[int(i) for i in record["completion_ids"]],
                    logps=[float(v) for v in record["logps"]],
                    truncated=bool(record.get("truncated", False)),
                )
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"given": sorted(self._given)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._given = {int(i) for i in state.get("given", ())}
