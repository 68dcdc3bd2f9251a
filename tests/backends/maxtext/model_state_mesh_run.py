"""MaxText's ``model_state`` on a mesh of 4 simulated CPU devices (fsdp 2 x tensor 2),
in a fresh process; results as JSON.

    python model_state_mesh_run.py OUT.json HF_DIR WORKDIR

``recipes/maxtext_tiny.py --init-from HF_DIR`` runs 2 steps: step 1's gradients (before
clipping, by Hugging Face name) are reduced to norms on the device; then layer 0 is
frozen and step 2 must leave it bitwise unchanged. The device count is fixed when JAX
starts, hence a process of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "maxtext_tiny.py"


def main(out: Path, hf_dir: Path, work: Path) -> None:
    import jax.numpy as jnp

    from baton.core import Callback
    from baton.core.cli.recipe import build_driver

    report: dict[str, Any] = {}

    class Probe(Callback):
        def on_setup(self, driver: Any) -> None:
            state = driver.backend.model_state()

            def watch(grads: Any) -> None:
                if "norms" in report:
                    report["shown_at_step_2"] = sorted(grads)
                    return
                squares = {n: jnp.sqrt(jnp.sum(g * g)) for n, g in grads.items()}
                report["norms"] = state.fetch(state.sum_over_ranks(squares))
                report["sharding"] = str(grads["model.layers.1.mlp.up_proj.weight"].sharding)

            state.watch_gradients(watch)

        def on_step_end(self, driver: Any, output: Any) -> None:
            state = driver.backend.model_state()
            layer0 = {p.name: np.array(p.value) for p in state.parameters("model.layers.0.*")}
            if driver.step == 1:
                report["batch_size"] = int(driver.backend.hparams.global_batch_size_to_load)
                report["mesh"] = {k: int(v) for k, v in driver.backend.mesh.shape.items()}
                self.layer0 = layer0
                state.freeze("model.layers.0.*")
            else:
                report["frozen_unchanged"] = all(
                    np.array_equal(value, self.layer0[name]) for name, value in layer0.items()
                )

    argv = [
        "--devices=4", "--dp-shard=2", "--tp=2",
        "--init-from", str(hf_dir), "--max-steps=2", "--log-every=1", "--save-every=0",
        "--eval-every=0", "--batch-size=2", "--no-progress", "--no-print-loss",
        f"--run-dir={work}", "--overrides", "dtype=float32",
    ]  # fmt: skip
    driver = build_driver(RECIPE, argv)
    driver.callbacks.append(Probe())
    driver.fit()
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
