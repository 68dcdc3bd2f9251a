"""Two CPU ranks under torchrun for the Megatron corruption test: data parallel 2 on
gloo, a bit of one parameter flipped on rank 1 before step 3, ``CorruptionCheck`` every
2 steps. Each rank writes ``<out>/rank<r>.json``: the findings, the last step, the
optimizer states its checksums cover and the keys refused abilities give."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from baton.backends.megatron import MegatronBackend, MegatronConfig
from baton.backends.megatron.config import tiny_transformer_config
from baton.callbacks import CorruptionCheck
from baton.core import Callback, Driver

FLIPPED = "decoder.layers.0.mlp.linear_fc1.weight"


class FlipBit(Callback):
    """Flips the bit; also reads what the checksums cover (after step 1)."""

    keys: dict[str, str] = {}
    refused: dict[str, str] = {}

    def on_step_end(self, driver: Driver, output: Any) -> None:
        backend: Any = driver.backend
        if driver.step == 1:
            self.keys = backend.gather_weight_checksums()[backend.rank]
            self.refused = dict(backend.abilities().refused)

    def on_step_start(self, driver: Driver) -> None:
        backend: Any = driver.backend
        if backend.rank == 1 and driver.step + 1 == 3:
            param = dict(backend.chunks[0].module.named_parameters())[FLIPPED]
            with torch.no_grad():
                param.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 12)


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    config = MegatronConfig(model=tiny_transformer_config(num_layers=1), warmup_steps=2)
    config.data.kind = "mock"  # Megatron's mock dataset: nothing to build
    check, flip = CorruptionCheck(every_n_steps=2), FlipBit()
    backend = MegatronBackend(config)
    driver = Driver(backend, [check, flip], max_steps=6, log_every=2, run_dir=out / "run")
    driver.fit()
    keys = flip.keys
    result = {
        "findings": check.findings,
        "last_good_step": check.last_good_step,
        "step": driver.step,
        "states": sorted({key.rpartition(":")[2] for key in keys if ":" in key}),
        "refused": flip.refused,
    }
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
