"""One attempt of ``recipes/megatron_gpt_tiny.py`` (post-training) recording the packed
rows each data-parallel rank reads.

python posttrain_elastic_worker.py OUT STOP_AT RECIPE_ARGS...               (one rank)
torchrun --nproc-per-node 2 posttrain_elastic_worker.py OUT STOP_AT ...     (data parallel 2)

Resumes the run directory's last checkpoint, saves and stops at step STOP_AT; rank r
writes ``OUT.rank<r>``: the row indices its stream asked the dataset for, in order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from elastic_worker import Record  # the pretraining worker's recorder, beside this file

from baton.core.cli.recipe import build_driver

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "megatron_gpt_tiny.py"


def main() -> None:
    out, stop_at, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    record = Record(stop_at)
    driver = build_driver(RECIPE, [*args, "--resume", "auto"])
    driver.callbacks.append(record)
    driver.fit()
    Path(f"{out}.rank{driver.backend.rank}").write_text(json.dumps(record.read))


if __name__ == "__main__":
    main()
