"""Run a recipe and SIGKILL its process once the checkpoint of one step is complete
(locally, or in the bucket too) and before the next save starts: what a crash between
two saves leaves behind. It checks the save completes in time and fails otherwise.

    python tests/support/killed_run.py --saved 10 --next-save 20 [--bucket s3://b/run] \\
        recipes/megatron_gpt_tiny.py --run-dir /tmp/r --save-every 10 --max-steps 1000

Exit status: killed by SIGKILL (-9 to the parent) when the checkpoint of ``--saved``
was complete in time; 3 when the loop reached ``--next-save`` first.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from baton.core import Callback, DriverView, StepOutput

#: exit status of a run whose checkpoint was not complete before the next save
LATE = 3


class KillAfterSave(Callback):
    """SIGKILLs the process at the first step end after checkpoint ``saved`` is complete
    (its ``latest`` points at it, in the bucket when ``bucket`` is given); exits with
    ``LATE`` when step ``next_save`` comes first. Each step lasts at least
    ``min_step_s`` seconds, as a real model's do, so the window spans wall time too."""

    def __init__(self, saved: int, next_save: int, bucket: str = "", min_step_s: float = 0.1):
        self.name = f"step_{saved:06d}"
        self.saved, self.next_save = saved, next_save
        self.bucket, self.min_step_s = bucket, min_step_s
        self._started = 0.0

    def on_step_start(self, driver: DriverView) -> None:
        self._started = time.perf_counter()

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        time.sleep(max(0.0, self.min_step_s - (time.perf_counter() - self._started)))
        if driver.step <= self.saved:
            return
        if self._complete(driver):
            print(f"killing at step {driver.step}: {self.name} complete", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if driver.step + 1 >= self.next_save:
            print(f"{self.name} not complete by step {driver.step}", flush=True)
            os._exit(LATE)

    def _complete(self, driver: DriverView) -> bool:
        latest = driver.checkpoint_dir / "latest"
        if not (latest.is_symlink() and Path(os.readlink(latest)).name == self.name):
            return False
        if not self.bucket:
            return True
        from baton.callbacks.object_store import ObjectStore

        return ObjectStore.open(self.bucket).latest() == self.name


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--saved", type=int, required=True)
    parser.add_argument("--next-save", type=int, required=True)
    parser.add_argument("--bucket", default="")
    parser.add_argument("recipe")
    args, recipe_argv = parser.parse_known_args(argv)
    from baton.core.cli.recipe import build_driver

    driver = build_driver(Path(args.recipe), recipe_argv)
    assert driver is not None
    driver.callbacks.append(KillAfterSave(args.saved, args.next_save, args.bucket))
    driver.fit()


if __name__ == "__main__":  # Megatron's writer may spawn processes that re-import this
    main(sys.argv[1:])
