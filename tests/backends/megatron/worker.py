"""Megatron training runs in their own process, for the tests (and under torchrun).

python worker.py --steps 12 --runs base,do --resume auto --out runs.json --run-dir DIR
torchrun --nproc-per-node 2 worker.py --steps 4 --runs base,tp2,plain-tp2 --out ... --run-dir DIR

Each name in ``--runs`` is one run in this process, in order: a parallel layout
(``plain.Layout``: ``tp2``, ``pp2``, ``vpp2``, ``sp``, ``do`` for the distributed
optimizer, ``bpe`` for the prepared data of ``--data-path``/``--tokenizer``; ``base`` is
one rank's default). A ``plain-`` name runs the plain Megatron-Core loop instead of baton.
``NAME@FROM`` resumes run directory ``DIR/FROM`` under layout NAME. Heavy imports stay
inside ``main`` so the checkpoint writer's spawned helper, which re-imports this file,
starts quickly. Rank 0 writes {"<name>": {"losses": {step: loss}, "resumed_from": ...,
"checkpoints": [...], "rank": ..., "world_size": ..., "error": ...}}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--resume", default="none")
    parser.add_argument("--runs", default="base", help="comma list of run names")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--data-path", default=None, help="prepared prefix or blend (bpe runs)")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--train-samples", type=int, default=None)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).parent))
    import os

    import torch.distributed as dist
    from plain import Layout, plain_loop

    from baton.backends.megatron import MegatronBackend, MegatronConfig
    from baton.core import Callback, Driver
    from baton.data import parse_blend

    class Record(Callback):
        def __init__(self) -> None:
            self.losses: dict[int, float] = {}

        def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
            if "loss" in metrics:
                self.losses[driver.step] = metrics["loss"]

        def on_step_end(self, driver: Driver, output: object) -> None:
            if driver.step == args.save_at:
                driver.control.request_save("test", all_ranks=True)

    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        # one process group for all runs here (the backend uses it and leaves it alone)
        dist.init_process_group("gloo")
    runs: dict[str, dict[str, object]] = {}
    for name in args.runs.split(","):
        layout_name, _, source = name.partition("@")
        layout = Layout.parse(layout_name)
        if layout_name.startswith("plain"):
            data = {"prefix": f"{args.data_dir}/text"}
            if layout.bpe:
                data = {
                    "blend": parse_blend(args.data_path).megatron(),
                    "tokenizer": args.tokenizer,
                    "train_samples": args.train_samples,
                }
            runs[name] = {"losses": dict(enumerate(plain_loop(layout, args.steps, **data), 1))}
            continue
        config = MegatronConfig(
            model=layout.transformer_config(),
            micro_batch_size=layout.micro_batch_size,
            global_batch_size=layout.global_batch_size,
            warmup_steps=3,
            decay_steps=20,
            vocab_size=layout.vocab_size,
        )
        config.ddp.use_distributed_optimizer = layout.distributed_optimizer
        config.data.cache_dir = args.data_dir
        if layout.bpe:
            config.data.data_path = args.data_path
            config.data.tokenizer = args.tokenizer
            config.data.train_samples = args.train_samples
        record = Record()
        driver = Driver(
            MegatronBackend(config),
            [record],
            max_steps=args.steps,
            log_every=1,
            run_dir=f"{args.run_dir}/{source or layout_name}",
            resume="auto" if source else args.resume,
        )
        driver.options = driver.options.replace(async_save=args.async_save)
        entry: dict[str, object] = {"rank": driver.backend.rank}
        try:
            result = driver.fit()
        except Exception as error:  # a refused layout: the message is the result
            entry["error"] = f"{type(error).__name__}: {error}"
            runs[name] = entry
            continue
        entry.update(
            losses=record.losses,
            resumed_from=str(result.resumed_from) if result.resumed_from else None,
            checkpoints=[str(p) for p in result.checkpoints],
            world_size=driver.backend.world_size,
            launch=_launch_facts(),
        )
        runs[name] = entry
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump(runs, fh)
    else:  # where each other rank stood: its launch facts per run
        with open(f"{args.out}.rank{rank}", "w") as fh:
            json.dump({name: run.get("launch") for name, run in runs.items()}, fh)
    if dist.is_initialized():
        dist.destroy_process_group()


def _launch_facts() -> dict[str, object]:
    from baton.core.launch import Launch

    launch = Launch.from_env()
    return {"rank": launch.rank, "local_rank": launch.local_rank, "node": launch.node_rank}


if __name__ == "__main__":
    main()
