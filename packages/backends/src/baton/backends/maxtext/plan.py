"""A dry run of a MaxText config: its mesh, parameter count, FLOPs and the memory of the
weights per device (each parameter's shard under MaxText's sharding rules), without
allocating the model, on simulated host devices (``MaxTextBackend.dry_run``, the
``dry_run`` ability behind ``baton run RECIPE --dry-run``).

Example::

    print(MaxTextBackend(config).dry_run(world_size=8))    # before JAX starts
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from typing import Any

from baton.backends.maxtext.config import MaxTextConfig
from baton.backends.maxtext.patches import simulate_host_devices
from baton.core.patches import PatchRecorder


@dataclass
class Plan:
    """What a MaxText config would build, found without allocating the model (a dry run)."""

    mesh_shape: dict[str, int]
    devices: str
    params: int
    tflops_per_device_step: float
    global_batch: int
    seq_len: int
    #: bytes of one device's shards of the weights (the largest over the devices' shapes)
    weight_bytes_per_device: int = 0

    def summary(self) -> str:
        axes = {k: v for k, v in self.mesh_shape.items() if v > 1} or {"(all axes)": 1}
        return "\n".join(
            [
                f"devices      {self.devices}",
                "mesh         " + "  ".join(f"{k}={v}" for k, v in axes.items()),
                f"mesh (full)  {self.mesh_shape}",
                f"parameters   {self.params:,} ({self.params / 1e9:.2f} B)",
                f"batch        {self.global_batch} x {self.seq_len} tokens per step",
                f"TFLOPs       {self.tflops_per_device_step:,.1f} per device per step",
                f"memory       {self.weight_bytes_per_device / 2**30:,.2f} GiB of weights per "
                f"device, {3 * self.weight_bytes_per_device / 2**30:,.2f} GiB with AdamW's two "
                "moments (activations and gradients not counted)",
            ]
        )


def planned_on_host(config: MaxTextConfig, devices: int) -> str:
    """The plan of ``config`` on ``devices`` simulated host (CPU) devices, MaxText's
    outputs in a temporary folder; JAX must not have started with another count."""
    config = copy.deepcopy(config)
    recorder = PatchRecorder()
    simulate_host_devices(recorder, devices)
    try:
        with tempfile.TemporaryDirectory(prefix="baton-dry-run-") as output:
            config.update({"skip_jax_distributed_system": True, "base_output_directory": output})
            config["jax_cache_dir"] = ""
            return dry_run(config, devices).summary()
    finally:
        recorder.undo()  # JAX has read the settings; the process gets its own back


def dry_run(config: MaxTextConfig, simulate_devices: int | None = None) -> Plan:
    """Validate ``config`` with MaxText and build its mesh and abstract model (no arrays)."""
    import jax
    from flax import nnx
    from maxtext.trainers.pre_train import train
    from maxtext.utils import max_utils, maxtext_utils, model_creation_utils

    if simulate_devices and jax.device_count() != simulate_devices:
        raise RuntimeError(
            f"JAX already started with {jax.device_count()} devices; run the dry run in a "
            f"fresh process to simulate {simulate_devices}"
        )
    cfg, _recorder = train.initialize(config.argv())
    try:
        mesh = maxtext_utils.get_mesh_from_config(cfg)
    except (AssertionError, ValueError) as error:
        layout = {
            key: value
            for key, value in config.overrides.items()
            if key.startswith(("ici_", "dcn_")) and value != 1
        }
        raise ValueError(
            f"layout {layout or '(defaults)'} does not fit {jax.device_count()} devices "
            f"({jax.process_count()} processes): {error}"
        ) from None
    _create, abstract_model = model_creation_utils.create_nnx_abstract_model(cfg, mesh)
    weights = nnx.state(abstract_model, nnx.Param)
    params = max_utils.calculate_num_params_from_pytree(weights)
    tflops, _, _ = maxtext_utils.calculate_tflops_training_per_device(cfg, log=False)
    first = jax.devices()[0]
    return Plan(
        mesh_shape=dict(mesh.shape),
        devices=f"{jax.device_count()} x {first.platform} ({cfg.hardware} config)",
        params=int(params),
        tflops_per_device_step=float(tflops),
        global_batch=int(cfg.global_batch_size_to_train_on),
        seq_len=int(cfg.max_target_length),
        weight_bytes_per_device=bytes_per_device(weights),
    )


def bytes_per_device(abstract: Any) -> int:
    """The bytes of one device's shards of an abstract tree (``ShapeDtypeStruct`` leaves
    with their ``NamedSharding``)."""
    import math

    import jax
    import numpy as np

    total = 0
    for leaf in jax.tree.leaves(abstract):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total
