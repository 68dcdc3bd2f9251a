"""Run a recipe whose ``--callback`` flags name Freeze and EMA, with a probe that writes,
per rank, what that rank saw through ``model_state`` to ``OUT.rank<R>.json``:
``torchrun ... pipeline_callbacks_worker.py OUT RECIPE ARGS...``.

Per rank: the parameter names it holds, the names Freeze froze, whether those stayed
bit-identical through training while the others moved, the names EMA averages and its
update count at the start (a resume restores them) and at the end, and whether each
average differs from its weight exactly where the weight trained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from baton.callbacks.ema import EMA
from baton.callbacks.freeze import Freeze
from baton.core.callback import Callback
from baton.core.cli.recipe import build_driver


def the(kind: type, driver: Any) -> Any:
    (found,) = [c for c in driver.callbacks if isinstance(c, kind)]
    return found


class PipelineProbe(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out
        self.seen: dict[str, Any] = {}
        self.at_start: dict[str, torch.Tensor] = {}

    def on_train_start(self, driver: Any) -> None:
        pieces = driver.backend.model_state().parameters()
        self.at_start = {p.name: p.value.clone() for p in pieces}
        ema = the(EMA, driver)
        self.seen["names"] = sorted(self.at_start)
        self.seen["ema_updates_at_start"] = ema.updates
        self.seen["ema_names_at_start"] = sorted(ema.averages)

    def on_train_end(self, driver: Any) -> None:
        pieces = driver.backend.model_state().parameters()
        freeze, ema = the(Freeze, driver), the(EMA, driver)
        frozen = set(freeze.frozen)
        self.seen["frozen"] = sorted(frozen)
        self.seen["flagged_frozen"] = sorted(p.name for p in pieces if p.frozen)
        self.seen["frozen_kept_others_moved"] = all(
            torch.equal(p.value, self.at_start[p.name]) == (p.name in frozen) for p in pieces
        )
        self.seen["ema_names"] = sorted(ema.averages)
        self.seen["ema_updates"] = ema.updates
        self.seen["ema_differs_where_trained"] = all(
            torch.equal(ema.averages[p.name], p.value) == (p.name in frozen) for p in pieces
        )
        rank = driver.backend.rank
        Path(f"{self.out}.rank{rank}.json").write_text(json.dumps(self.seen))


def main(out: Path, recipe: str, args: list[str]) -> None:
    driver = build_driver(recipe, args)
    driver.callbacks.append(PipelineProbe(out))
    driver.fit()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
