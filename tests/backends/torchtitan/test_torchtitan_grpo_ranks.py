"""GRPO on TorchTitan under FSDP 2 and TP 2 (torchrun, two gloo ranks): rank 0 replays the
fixed rollouts, ``broadcast`` hands the batch to both ranks (FSDP: each trains its 8 rows
of the 16; TP: both train all 16 with the vocabulary sharded), and the steps equal one
rank's (``--num-iterations 2``: the second step, after a sharded optimizer step, too; with
beta 0.04, whose KL is above 0 there). ``gather_weights`` assembles the sharded weights
whole on rank 0 only, equal to ``baton export``'s safetensors of the run's checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

import torch

from support.torchrun import torchrun

from .test_torchtitan_grpo import fit, fixed_flags

HERE = Path(__file__).parent
#: what differs between runs of the same steps (seconds, speeds)
TIMES = ("timing/", "throughput/", "train_time_s", "time/")


LAYOUTS = {"fsdp2": ["--dp-shard", "2", "--batch-size", "8"],
           "tp2": ["--dp-shard", "1", "--tp", "2", "--batch-size", "16"]}  # fmt: skip


def steady(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith(TIMES)}


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_grpo_on_two_ranks_equals_one_rank(grpo_assets, layout, tmp_path):
    files = grpo_assets["files"]
    extra = ["--max-steps", "2", "--save-every", "2"]
    settings = {"num_iterations": 2, "beta": 0.04}
    single = fit(fixed_flags(files, tmp_path / "single", *extra, **settings)).metrics
    out = tmp_path / "out"
    out.mkdir()
    flags = fixed_flags(files, tmp_path / layout, *extra, **settings)
    torchrun(HERE / "grpo_worker.py", str(out), *flags, *LAYOUTS[layout])
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["gathered"] for r in ranks] == [True, False]  # whole weights on rank 0 only
    first, second = ({int(s): steady(m) for s, m in r["metrics"].items()} for r in ranks)
    assert first == second  # the global values, on every rank
    for step in (1, 2):
        print(f"{layout} step {step}: loss {first[step]['loss']!r} (one rank "
              f"{single[step]['loss']!r}), grad_norm {first[step]['grad_norm']!r} (one rank "
              f"{single[step]['grad_norm']!r})")  # fmt: skip
        for name in ("loss", "grad_norm", "entropy", "clip_ratio/region_mean", "reward"):
            assert first[step][name] == pytest.approx(single[step][name], rel=1e-5), (step, name)
        # k3 of log-probabilities 1e-7 apart in another summation order: 1e-4 of it
        assert first[step]["kl"] == pytest.approx(single[step]["kl"], rel=1e-4, abs=1e-9), step
    assert first[2]["clip_ratio/region_mean"] > 0  # the second step's ratios differ from 1
    assert first[2]["kl"] > 1e-6

    from safetensors.torch import load_file

    from baton.tools.export import main as export_main

    checkpoint = tmp_path / layout / "checkpoints" / "step_000002"
    assert export_main([str(checkpoint), str(tmp_path / "hf"), "--format", "hf"]) == 0
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    gathered = load_file(str(out / "gathered.safetensors"))
    assert set(gathered) == set(exported)
    for name, value in exported.items():
        assert torch.equal(gathered[name], value), name
