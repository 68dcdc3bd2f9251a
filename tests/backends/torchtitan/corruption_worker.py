"""Two CPU ranks under torchrun for the TorchTitan corruption test: HSDP with
``dp_replicate`` 2 (``dp_shard`` 1) on gloo, a bit of one parameter flipped on rank 1
before step 3, ``CorruptionCheck`` every 2 steps. Each rank writes
``<out>/rank<r>.json``: the findings, the last step and the optimizer states covered."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import titan_worker as worker  # noqa: E402

from baton.backends.torchtitan import TorchTitanBackend  # noqa: E402
from baton.backends.torchtitan.configs import set_layout  # noqa: E402
from baton.callbacks import CorruptionCheck  # noqa: E402
from baton.core import Callback, Driver  # noqa: E402

FLIPPED = "layers.0.feed_forward.w1.weight"


class FlipBit(Callback):
    """Flips the bit; also reads which optimizer states the checksums cover (step 1)."""

    states: list[str] = []

    def on_step_end(self, driver: Driver, output: Any) -> None:
        backend: Any = driver.backend
        if driver.step == 1:
            keys = backend.gather_weight_checksums()[backend.rank]
            self.states = sorted({k.rpartition(":")[2] for k in keys if ":" in k})

    def on_step_start(self, driver: Driver) -> None:
        backend: Any = driver.backend
        if backend.rank == 1 and driver.step + 1 == 3:
            param = dict(backend.trainer.model_parts[0].named_parameters())[FLIPPED]
            local = param.to_local() if hasattr(param, "to_local") else param
            with torch.no_grad():
                local.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 12)


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    config = set_layout(
        worker.small_config(str(out / "titan"), steps=6), dp_replicate=2, dp_shard=1
    )
    check, flip = CorruptionCheck(every_n_steps=2), FlipBit()
    driver = Driver(
        TorchTitanBackend(config), [check, flip], max_steps=6, log_every=2, run_dir=out / "run"
    )
    driver.fit()
    result = {"findings": check.findings, "step": driver.step, "states": flip.states}
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
