"""TorchTitan's parallel layouts under baton, on CPU ranks (gloo); one launch runs several.

python -m torch.distributed.run --nnodes 2 --nproc-per-node 1 ... layouts_worker.py nodes OUT
    two "nodes" of one rank each: FSDP 2 saves and resumes (checkpoints written once),
    the same checkpoint onto TP 2 (refused, then resharded), pipeline parallel 2 and
    tensor parallel 2 against TorchTitan's Trainer.train()
torchrun --nproc-per-node 4 layouts_worker.py grid OUT     # FSDP 2 x TP 2 against train()

Each rank writes ``OUT/<mode>_rank<R>.json``; the test reads and compares them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import titan_worker as worker  # noqa: E402

from baton.backends.torchtitan import TorchTitanBackend  # noqa: E402
from baton.backends.torchtitan.configs import set_layout  # noqa: E402
from baton.core import Callback, Driver  # noqa: E402
from baton.core.checkpoints.files import CheckpointError  # noqa: E402
from baton.core.launch import Launch  # noqa: E402

STEPS = 4
SAVE_AT = 2


def layout_config(dump_folder: Path, steps: int = STEPS, **degrees: Any) -> Any:
    """The tests' debug-model config (bytes of the language reference) on a layout."""
    config = worker.small_config(str(dump_folder), steps=steps)
    return set_layout(config, **degrees)


def full_state(trainer: Any) -> dict[str, torch.Tensor]:
    """Model and optimizer state as full (unsharded) tensors, keyed by TorchTitan's FQNs."""
    state: dict[str, torch.Tensor] = {}
    for part in trainer.model_parts:
        for key, value in part.state_dict().items():
            state[f"model/{key}"] = _full(value)
    for key, value in trainer.optimizers.state_dict().items():
        if isinstance(value, torch.Tensor):
            state[f"optim/{key}"] = _full(value)
    return state


def _full(value: torch.Tensor) -> torch.Tensor:
    value = value.full_tensor() if hasattr(value, "full_tensor") else value
    return value.detach().cpu().clone()


class Facts(Callback):
    """A stateful callback: counts steps (its count must follow a resume), records the
    driver's step and, when asked, the full state at a step or right after the load."""

    state_key = "layout_facts"

    def __init__(self, capture_at: int | None = None, capture_start: bool = False) -> None:
        self.count = 0
        self.capture_at = capture_at
        self.capture_start = capture_start
        self.state: dict[str, torch.Tensor] | None = None
        self.start: dict[str, Any] = {}

    def on_train_start(self, driver: Driver) -> None:
        self.start = {"step": driver.step, "count": self.count}
        if self.capture_start:
            self.state = full_state(driver.backend.trainer)

    def on_step_end(self, driver: Driver, output: Any) -> None:
        self.count += 1
        if driver.step == self.capture_at:
            self.state = full_state(driver.backend.trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])


def run(config: Any, run_dir: Path, *, resume: str | Path = "none", **options: Any) -> Any:
    """A baton run of ``config``; returns (losses by step, driver, Facts)."""
    facts = Facts(capture_at=options.pop("capture_at", None), capture_start=resume != "none")
    record = worker.RecordLosses(options.pop("save_at", None))
    backend = TorchTitanBackend(config, **options)
    driver = Driver(
        backend,
        [record, facts],
        max_steps=config.training.steps,
        log_every=1,
        run_dir=run_dir,
        resume=resume,
    )
    driver.fit()
    return record.losses, driver, facts


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def nodes(out: Path) -> dict[str, Any]:
    """Two ranks on two "nodes": FSDP save/resume, resharding, PP 2 and TP 2 parity."""
    launch = Launch.from_env()
    result: dict[str, Any] = {"launch": vars(launch) | {"source": launch.source}}
    run_dir = out / "fsdp"
    checkpoint = run_dir / "checkpoints" / f"step_{SAVE_AT:06d}"

    # FSDP 2: 4 steps, saving at step 2; then a resume of that checkpoint
    losses, _, facts = run(
        layout_config(out / "t_fsdp", dp_shard=2), run_dir, save_at=SAVE_AT, capture_at=SAVE_AT
    )
    saved = facts.state
    assert saved is not None
    if dist.get_rank() == 0:
        torch.save(saved, out / "fsdp_state_step2.pt")
    result["fsdp_losses"] = losses
    resumed, _, facts = run(
        layout_config(out / "t_fsdp2", dp_shard=2), out / "fsdp_again", resume=checkpoint
    )
    result["fsdp_resumed_losses"] = resumed
    result["fsdp_resumed_start"] = facts.start
    result["fsdp_resumed_state_equal"] = same(facts.state or {}, saved)

    # the same checkpoint on TP 2: refused by default (the data position cannot reshard)
    try:
        run(layout_config(out / "t_tp_refused", dp_shard=1, tp=2), out / "tp_refused",
            resume=checkpoint)  # fmt: skip
        result["tp_refused"] = None
    except CheckpointError as error:
        result["tp_refused"] = str(error)
    # ... and resharded with the data restarted
    losses, _, facts = run(
        layout_config(out / "t_tp_resharded", dp_shard=1, tp=2),
        out / "tp_resharded",
        resume=checkpoint,
        reshard_data="restart",
    )
    result["tp_resharded_start"] = facts.start
    result["tp_resharded_state_equal"] = same(facts.state or {}, saved)
    result["tp_resharded_tensors"] = len(saved)
    result["tp_resharded_losses"] = losses

    # pipeline parallel 2 (1F1B, 2 microbatches) and tensor parallel 2 against train()
    for name, degrees in (("pp", {"dp_shard": 1, "pp": 2}), ("tp", {"dp_shard": 1, "tp": 2})):
        losses, _, _ = run(layout_config(out / f"t_{name}", **degrees), out / f"{name}_run")
        reference = worker.reference_losses(layout_config(out / f"t_{name}_ref", **degrees))
        result[f"{name}_losses"] = losses
        result[f"{name}_reference"] = reference
    return result


def grid(out: Path) -> dict[str, Any]:
    """Four ranks: FSDP 2 x TP 2 against Trainer.train() with the same layout."""
    losses, _, _ = run(layout_config(out / "t_grid", dp_shard=2, tp=2), out / "grid_run")
    reference = worker.reference_losses(layout_config(out / "t_grid_ref", dp_shard=2, tp=2))
    return {"grid_losses": losses, "grid_reference": reference}


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(300, exit=True)  # a hang prints every stack and exits
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    # one process group for every run in this process (the backend joins it)
    dist.init_process_group("gloo")
    try:
        facts = {"nodes": nodes, "grid": grid}[mode](out_dir)
    finally:
        dist.destroy_process_group()
    rank = int(os.environ["RANK"])
    (out_dir / f"{mode}_rank{rank}.json").write_text(json.dumps(facts, default=str))
