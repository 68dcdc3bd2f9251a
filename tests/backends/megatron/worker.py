"""A Megatron training run in its own process, for the tests (and under torchrun).

python worker.py --steps 12 --save-at 6 --out runs.json --run-dir DIR [--resume auto]
torchrun --nproc-per-node 2 worker.py --steps 5 --tp 1,2 --out runs.json --run-dir DIR

Heavy imports stay inside ``main`` so the checkpoint writer's spawned helper, which
re-imports this file, starts quickly. ``--tp 1,2`` trains twice in this process, once
per tensor-parallel size (run directories ``DIR/tp<N>``). Rank 0 writes
{"<tp>": {"losses": {step: loss}, "resumed_from": ..., "checkpoints": [...]}}.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--resume", default="none")
    parser.add_argument("--tp", default="1", help="comma list of tensor-parallel sizes")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--distributed-optimizer", action="store_true")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from baton.backends.megatron import MegatronBackend, MegatronConfig
    from baton.backends.megatron.config import tiny_transformer_config
    from baton.core import Callback, Driver

    class Record(Callback):
        def __init__(self) -> None:
            self.losses: dict[int, float] = {}

        def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
            if "loss" in metrics:
                self.losses[driver.step] = metrics["loss"]

        def on_step_end(self, driver: Driver, output: object) -> None:
            if driver.step == args.save_at:
                driver.control.request_save("test", all_ranks=True)

    import os

    import torch.distributed as dist

    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        # one process group for all runs here (the backend uses it and leaves it alone)
        dist.init_process_group("gloo")
    runs: dict[str, dict[str, object]] = {}
    for tp in [int(t) for t in args.tp.split(",")]:
        config = MegatronConfig(
            model=tiny_transformer_config(tensor_model_parallel_size=tp),
            micro_batch_size=args.micro_batch_size,
            global_batch_size=args.global_batch_size,
            warmup_steps=3,
            decay_steps=20,
        )
        config.ddp.use_distributed_optimizer = args.distributed_optimizer
        config.data.cache_dir = args.data_dir
        record = Record()
        driver = Driver(
            MegatronBackend(config),
            [record],
            max_steps=args.steps,
            log_every=1,
            run_dir=f"{args.run_dir}/tp{tp}",
            resume=args.resume,
        )
        driver.async_save = args.async_save
        result = driver.fit()
        runs[str(tp)] = {
            "losses": record.losses,
            "resumed_from": str(result.resumed_from) if result.resumed_from else None,
            "checkpoints": [str(p) for p in result.checkpoints],
        }
    if driver.is_global_zero:
        with open(args.out, "w") as fh:
            json.dump(runs, fh)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
