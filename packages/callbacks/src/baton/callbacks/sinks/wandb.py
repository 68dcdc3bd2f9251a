"""Weights & Biases through the real ``wandb`` library (online, or offline with no network).

Example::

    CompositeLogger([WandbSink(project="baton", mode="offline")])
    # WANDB_MODE=offline works too; later: wandb sync runs/x/logs/wandb/offline-run-*

The run directory is ``<run_dir>/logs/wandb``; the W&B run id is kept in
``<run_dir>/logs/wandb_run_id`` so a resumed baton run continues the same W&B run.
Online, a resumed run rewinds the W&B run to the resumed step (``resume_from``), so
steps an interrupted run logged after its checkpoint are replaced, not doubled; offline
runs (which cannot rewind) continue the same run id. The recipe settings become the
W&B config.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase
    from baton.core import DriverView


class WandbSink:
    """Log metrics to a W&B run (``mode``: ``online``, ``offline``, ``disabled``, or env)."""

    name = "wandb"

    def __init__(
        self,
        project: str = "baton",
        *,
        name: str | None = None,
        entity: str | None = None,
        mode: str | None = None,
        tags: list[str] | None = None,
    ) -> None:
        self.project = project
        self.run_name = name
        self.entity = entity
        self.mode = mode
        self.tags = tags
        self.run: Any = None

    def open(self, driver: DriverView) -> None:
        import wandb

        log_dir = Path(driver.log_dir)
        (log_dir / "wandb").mkdir(parents=True, exist_ok=True)
        id_file = log_dir / "wandb_run_id"
        known = id_file.is_file()
        run_id = id_file.read_text().strip() if known else uuid.uuid4().hex[:8]
        id_file.write_text(run_id)
        self.run = wandb.init(
            project=self.project,
            entity=self.entity,
            name=self.run_name or Path(driver.options.run_dir).name,
            **self.resume_arguments(run_id, known, driver),
            dir=str(log_dir),
            mode=self.mode,  # type: ignore[arg-type]
            tags=self.tags,
            config=dict(driver.options.settings),
            settings=wandb.Settings(console="off", silent=True),
        )

    def resume_arguments(self, run_id: str, known: bool, driver: Any) -> dict[str, Any]:
        """``wandb.init`` arguments that continue ``run_id`` at the driver's step."""
        mode = self.mode or os.environ.get("WANDB_MODE", "online")
        resumed = known and driver.resumed_from is not None
        if resumed and mode == "online":
            return {"resume_from": f"{run_id}?_step={int(driver.step)}"}
        return {"id": run_id, "resume": "allow"}

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
