"""Megatron-Core's ``model_state``: from the same Hugging Face weights and one batch, the
gradients before clipping equal ``transformers``' (per parameter, Hugging Face names,
q/k/v and gate/up as views into the fused tensors) on one rank, under TP 2, PP 2 and data
parallel 2 with the distributed optimizer (whose reduce-scatter leaves each rank a shard);
freezing keeps weights and optimizer state bit-identical while the rest trains; a
learning rate set by a callback is the one the next step uses, and the schedule goes on
from it, also after a resume (which loads the frozen parameters' optimizer state). One 3-step run per layout checks all of it (``model_state_worker.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

import torch

from support.tiny_llama import load_llama, save_tiny_llama

sys.path.insert(0, str(Path(__file__).parent))
from model_state_worker import FROZEN, SET_LR, probe_run

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
WORKER = Path(__file__).with_name("model_state_worker.py")
MICRO_BATCH = 4


def _hf_gradient_norms(hf_dir: Path, batch: dict[str, list[list[int]]]) -> dict[str, float]:
    """Each parameter's gradient norm of Megatron's loss (the mean over micro-batches of
    each one's token-mean cross entropy) computed by autograd on the transformers model."""
    model = load_llama(hf_dir).train()
    tokens, labels = torch.tensor(batch["tokens"]), torch.tensor(batch["labels"])
    mask = torch.tensor(batch["loss_mask"]).float()
    losses = []
    for start in range(0, tokens.shape[0], MICRO_BATCH):
        part = slice(start, start + MICRO_BATCH)
        logits = model(tokens[part]).logits
        token_losses = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels[part].flatten(), reduction="none"
        )
        losses.append((token_losses * mask[part].flatten()).sum() / mask[part].sum())
    torch.stack(losses).mean().backward()
    return {name: float(p.grad.double().norm()) for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    "layout",
    [
        "single",
        pytest.param("tp2", marks=pytest.mark.slow),
        pytest.param("pp2", marks=pytest.mark.slow),
        pytest.param("dp2-distributed-optimizer", marks=pytest.mark.slow),
    ],
)
def test_gradients_freeze_and_lr_through_model_state(tmp_path, layout):
    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=512)
    out = tmp_path / "probe.json"

    def args(steps: int, *more: str) -> list[str]:
        return [
            "--init-from", str(hf_dir), "--max-steps", str(steps), "--warmup-steps", "3",
            "--lr", "3e-3", "--save-every", "0", "--no-async-save", "--eval-every", "0",
            "--batch-size", str(MICRO_BATCH), "--global-batch-size", "8",
            "--run-dir", str(tmp_path / "run"), "--no-progress", *more,
        ]  # fmt: skip

    if layout == "single":
        probe_run(out, str(RECIPE), args(3))
        # resumed from step 3's checkpoint (frozen parameters in the optimizer's state,
        # the lr set in its groups) inside a Freeze window: the schedule goes on scaled,
        # the Freeze callback freezes again
        from baton.callbacks.freeze import Freeze

        resumed = tmp_path / "resumed.json"
        more = ("--resume", "auto", "--allow-changed", "max_steps")
        probe_run(resumed, str(RECIPE), args(4, *more), Freeze(FROZEN, until_step=4))
        after = json.loads(resumed.read_text())
        # step 4 of 4 is at the floor (--lr / 10), scaled as the set value scaled step 2
        assert after["lrs"] == pytest.approx([3e-4 * SET_LR / 2e-3])
        assert after["checks"] == {"resumed_frozen_bitwise_others_trained": True}
    else:
        from support.torchrun import torchrun

        flags = {
            "tp2": ["--tp", "2"],
            "pp2": ["--pp", "2"],
            "dp2-distributed-optimizer": ["--distributed-optimizer"],
        }[layout]
        torchrun(WORKER, str(out), str(RECIPE), *args(3), *flags)
    seen = json.loads(out.read_text())

    expected = _hf_gradient_norms(hf_dir, seen["batch"])
    assert sorted(seen["norms"]) == sorted(expected)
    for name, norm in expected.items():
        assert seen["norms"][name] == pytest.approx(norm, rel=1e-4), name

    assert seen["checks"] == {
        "fused_part_refused": True,
        "froze_layer0_and_embedding": True,
        "frozen_bitwise_others_trained": True,
        "groups_report_set_lr": True,
    }
    # warmup over 3 steps to 3e-3: step 1 uses 1e-3, step 2 the value set (the schedule's
    # 2e-3 scaled by 0.625), step 3 the schedule's 3e-3 scaled alike
    assert seen["lrs"] == pytest.approx([1e-3, SET_LR, 1.5 * SET_LR], rel=1e-12)
