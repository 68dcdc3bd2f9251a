"""TorchTitan expert parallelism under baton, on two CPU ranks (gloo).

torchrun --nproc-per-node 2 ep_worker.py HF_DIR OUT

A tiny Qwen3-MoE (``HF_DIR``, 4 experts) trains 4 steps on FSDP 2 x EP 2 (two experts
per rank, tokens exchanged all-to-all) under baton's loop, saving at step 2, and under
TorchTitan's own ``Trainer.train()`` on the same layout; then the step-2 checkpoint
resumes on EP 1 (FSDP 2, every expert on every rank) through DCP's resharding, and an
EP 1 run from the start logs the same ``moe/load_balance`` as EP 2 (over both ranks'
tokens). Each
rank writes ``OUT/ep_rank<R>.json``; the test reads and compares them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import layouts_worker as layouts  # noqa: E402
import titan_worker as worker  # noqa: E402

from baton.backends.torchtitan import TorchTitanBackend  # noqa: E402
from baton.backends.torchtitan.configs import set_layout  # noqa: E402
from baton.backends.torchtitan.hf import init_from_hf, use_spec  # noqa: E402
from baton.core import Callback, Driver  # noqa: E402
from baton.core.model.spec import ModelSpec  # noqa: E402

STEPS, SAVE_AT = 4, 2


def moe_config(hf_dir: Path, dump_folder: Path, *, ep: int) -> Any:
    """The tests' small config training ``hf_dir``'s Qwen3-MoE from its weights on
    FSDP 2 with experts over ``ep`` ranks."""
    config = worker.small_config(str(dump_folder), steps=STEPS)
    use_spec(config, ModelSpec.from_hf(hf_dir))
    init_from_hf(config, str(hf_dir))
    return set_layout(config, dp_shard=2, ep=ep)


class Balance(Callback):
    """The logged ``moe/load_balance`` by step."""

    def __init__(self) -> None:
        self.values: dict[int, float] = {}

    def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
        self.values[driver.step] = metrics["moe/load_balance"]


def balance_run(config: Any, run_dir: Path, **options: Any) -> tuple[dict, dict]:
    """A baton run of ``config`` logging every step: (losses, load balance) by step."""
    record, balance = worker.RecordLosses(options.pop("save_at", None)), Balance()
    driver = Driver(TorchTitanBackend(config), [record, balance], max_steps=STEPS,
                    log_every=1, run_dir=run_dir, **options)  # fmt: skip
    driver.fit()
    return record.losses, balance.values


def main(hf_dir: Path, out: Path) -> dict[str, Any]:
    checkpoint = out / "ep2" / "checkpoints" / f"step_{SAVE_AT:06d}"
    losses, balance = balance_run(
        moe_config(hf_dir, out / "t_ep2", ep=2), out / "ep2", save_at=SAVE_AT
    )
    record = json.loads((checkpoint / "baton.json").read_text())["checkpoint"]
    result: dict[str, Any] = {"ep2_losses": losses, "ep2_layout": record["layout"]}
    result["ep2_balance"] = balance
    reference = moe_config(hf_dir, out / "t_ref", ep=2)
    reference.checkpoint.enable = True  # TorchTitan's initial load of the HF weights
    reference.checkpoint.interval = STEPS
    result["ep2_reference"] = worker.reference_losses(reference)
    resumed, _, facts = layouts.run(
        moe_config(hf_dir, out / "t_ep1", ep=1), out / "ep1", resume=checkpoint
    )
    result["ep1_resumed_losses"] = resumed
    result["ep1_resumed_start"] = facts.start
    # the same two steps on EP 1 from the start: the load balance is the global one
    _, result["ep1_balance"] = balance_run(moe_config(hf_dir, out / "t_ep1b", ep=1), out / "ep1b")
    return result


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(300, exit=True)  # a hang prints every stack and exits
    dist.init_process_group("gloo")
    try:
        facts = main(Path(sys.argv[1]), Path(sys.argv[2]))
    finally:
        dist.destroy_process_group()
    rank = int(os.environ["RANK"])
    (Path(sys.argv[2]) / f"ep_rank{rank}.json").write_text(json.dumps(facts, default=str))
