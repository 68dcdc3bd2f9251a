"""Run under torchrun with 2 processes: ``Trainer.fit`` with DDP (``trainer``) or baton's
LightningBackend (``baton``) on the corpus' ``ddp`` case; each rank writes what it saw.

``python lightning_ddp_worker.py MODE OUT_DIR RUN_DIR [MAX_STEPS SAVE_AT RESUME]``
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lightning_corpus as corpus


def main() -> None:
    mode, out, run_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if mode == "trainer":
        record = corpus.trainer_fit("ddp", run_dir)
    else:
        max_steps, save_at, resume = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        record, _ = corpus.baton_fit(
            "ddp", run_dir, max_steps, save_at=save_at or None, resume=resume
        )
    rank = int(os.environ["RANK"])
    seen = {"losses": record.losses, "validations": record.validations, "epochs": record.epochs}
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    if torch.distributed.is_initialized():  # as torch asks of every script (Trainer leaves it)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
