"""A rollout phase on two gloo ranks (torchrun): rank 0 samples, the batch reaches both by
``broadcast_object_list``, the weights are gathered from two halves of the LM head held
by the two ranks; after step 3 the phase's state is saved (rank 0 writes) and loaded into
fresh phases on both ranks, which run on. Each rank writes the batches it trained on and
how often it gathered weights to ``OUT/rank<r>.npz`` / ``.json``.

    torchrun --nproc-per-node 2 rollout_ranks_worker.py ROOT OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.rollouts import WeightSource, make_phase

STEPS = 5
SAVED_AFTER = 3


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    files = {"tokenizer": root / "tok", "policy": root / "policy", "prompts": root / "prompts"}
    source = WeightSource(files["policy"])
    half = source.base["lm_head.weight"].shape[0] // 2
    gathered = {"calls": 0}

    def gather_weights():
        """The LM head's rows held half by each rank, gathered whole on rank 0."""
        gathered["calls"] += 1
        scale = 1.0 + 0.1 * phase_step["done"]
        full = source.base["lm_head.weight"] * scale
        mine = full[rank * half : (rank + 1) * half].contiguous()
        parts = [torch.empty_like(mine) for _ in range(2)] if rank == 0 else None
        dist.gather(mine, parts, dst=0)
        if rank != 0:
            return None
        return {**source.base, "lm_head.weight": torch.cat(parts)}

    def broadcast(value):
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    phase_step = {"done": 0}

    def phase_on_this_rank():
        return make_phase(
            files,
            num_iterations=2,
            weights=None,
            is_first_rank=rank == 0,
            gather_weights=gather_weights,
            broadcast=broadcast,
        )

    phase = phase_on_this_rank()
    shares: dict[str, np.ndarray] = {}
    records: list[list[dict]] = []
    for step in range(1, STEPS + 1):
        phase_step["done"] = step - 1
        result = phase.before_step(step)
        mine = result.batch.rows_of(rank, 2)
        arrays, _ = mine.to_state()
        for name, array in arrays.items():
            shares[f"{step}/{name}"] = array
        records.append([r.to_json() for r in mine.records])
        if step == SAVED_AFTER:
            state = phase.save(out / "state", write=rank == 0)
            state = broadcast(state)  # every rank reads rank 0's baton.json
            dist.barrier()
            phase = phase_on_this_rank()
            phase.load(out / "state", state)
    np.savez(out / f"rank{rank}.npz", **shares)
    (out / f"rank{rank}.json").write_text(
        json.dumps({"records": records, "gathers": gathered["calls"]})
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
