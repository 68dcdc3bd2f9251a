"""What the round-trip tests share (``tests/backends/test_round_trip*.py``): one fixed
batch, the prepared corpus every training run reads, each backend trained 2 steps from
one Hugging Face directory and exported, and a MaxText target model loaded with each
export.

    data = prepared_corpus(root)
    exports = train_and_export(root, source, TRAIN, data)   # {"torchtitan": Path, ...}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from baton.core import Callback, DriverView
from baton.core.cli.recipe import build_driver

RECIPES = Path(__file__).parents[2] / "recipes"
VOCAB = 512
#: recipe and flags of each backend's 2-step training run
TRAIN = {
    "torchtitan": ("torchtitan_llama3_debug.py", ["--seq-len", "64", "--batch-size", "2"]),
    "megatron": ("megatron_gpt_tiny.py", ["--no-async-save"]),
    "fabric": ("hf_finetune.py", ["--eval-every", "0"]),  # nothing held out: no evaluation
    "maxtext": ("maxtext_tiny.py", [
        "--batch-size", "2", "--eval-every", "0", "--no-async-save",
        "--no-progress", "--overrides", "dtype=float32",
    ]),
}  # fmt: skip


def window() -> torch.Tensor:
    """A fixed batch of 2 x 33 token ids: inputs are the first 32, targets the last 32."""
    return torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(1))


def tokens() -> torch.Tensor:
    return window()[:, :-1]


def targets() -> torch.Tensor:
    return window()[:, 1:]


def prepared_corpus(root: Path) -> list[str]:
    """A 512-id byte-level BPE (end of document ``<|endoftext|>`` id 0, padding id 1) and
    the CPython reference prepared with it: the data flags every training run shares."""
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    tokenizer = train_tokenizer(root / "tok", vocab_size=VOCAB)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in reference_documents()))
    prepare([corpus], tokenizer, root / "corpus", workers=1)
    return ["--tokenizer", str(tokenizer.path), "--data-path", str(root / "corpus")]


def train_argv(source: Path, run_dir: Path, data: list[str], extra: list[str]) -> list[str]:
    """The flags of a 2-step run from ``source`` that saves its step 2."""
    argv = ["--init-from", str(source), "--max-steps", "2", "--save-every", "2"]
    return [*argv, "--log-every", "1", "--run-dir", str(run_dir), *data, *extra]


def export(run_dir: Path, out: Path) -> Path:
    """``baton export --format hf`` of the run's step-2 checkpoint into ``out``."""
    from baton.tools.export import main as export_main

    checkpoint = run_dir / "checkpoints" / "step_000002"
    assert export_main([str(checkpoint), str(out), "--format", "hf"]) == 0
    return out


class MaxTextLoads(Callback):
    """Once MaxText's setup has loaded ``--init-from`` (the recipe's conversion, then
    MaxText's ``load_parameters_path``): the model's cross entropy, load-balancing loss
    and logits on the fixed batch. Then each other Hugging Face directory through the
    same conversion (``hf.write_params``) and MaxText's ``load_params_from_path``, and
    its logits."""

    def __init__(self, others: dict[str, Path], work: Path) -> None:
        self.others, self.work = others, work
        self.logits: dict[str, torch.Tensor] = {}
        self.loss = float("nan")  # by MaxText's eval_step on the fixed batch
        self.aux_loss = float("nan")  # its moe_lb_loss there

    def on_train_start(self, driver: DriverView) -> None:
        from baton.backends.maxtext.hf import write_params
        from support.maxtext_forward import load_params, logits, losses

        backend, batch = driver.backend, tokens().numpy()
        self.loss, self.aux_loss = losses(backend, batch, targets().numpy())
        self.logits["init-from"] = torch.from_numpy(logits(backend, batch))
        for name, hf_dir in self.others.items():
            load_params(backend, write_params(hf_dir, self.work / name))
            self.logits[name] = torch.from_numpy(logits(backend, batch))


def maxtext_target(source: Path, others: dict[str, Path], root: Path) -> MaxTextLoads:
    """One MaxText model (fp32), built by ``maxtext_tiny.py --init-from source`` and
    stopped before its first step, then loaded with each of ``others``."""
    argv = ["--init-from", str(source), "--run-dir", str(root / "maxtext-target")]
    argv += ["--max-steps", "1", "--batch-size", "2", "--seq-len", "32", "--eval-every", "0"]
    argv += ["--save-every", "0", "--no-callback", "checkpoint", "--no-progress"]
    driver = build_driver(RECIPES / "maxtext_tiny.py", [*argv, "--overrides", "dtype=float32"])
    assert driver is not None
    # setup (which loads --init-from) and the callbacks, no step
    driver.options = driver.options.replace(max_steps=0)
    loads = MaxTextLoads(others, root / "maxtext-params")
    driver.callbacks.append(loads)
    driver.fit()
    return loads


def megatron_target(hf_dir: Path, run_dir: Path) -> Any:
    """Megatron-Core's backend as ``megatron_gpt_tiny.py --init-from hf_dir`` builds it
    (not set up: ``support.megatron_model`` runs it)."""
    argv = ["--init-from", str(hf_dir), "--run-dir", str(run_dir)]
    driver = build_driver(RECIPES / "megatron_gpt_tiny.py", argv)
    assert driver is not None
    return driver.backend
