"""The standard callbacks under 2 CPU ranks (torchrun, gloo, Fabric DDP): one launch,
several runs (see ``multirank_worker.py``). Ranks must agree on every decision: when
to stop, what to save, where to roll back to, and rank 0 alone writes files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from support.torchrun import torchrun

WORKER = Path(__file__).with_name("multirank_worker.py")


def _losses(run: dict[str, Any]) -> dict[int, float]:
    return {int(step): loss for step, loss in run["losses"]}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("multirank")
    torchrun(WORKER, str(out), timeout=300)
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _same_on_both(ranks: list[dict[str, Any]], run: str, *keys: str) -> None:
    for key in keys:
        assert ranks[0][run][key] == ranks[1][run][key], f"{run}: ranks differ on {key}"


@pytest.mark.slow
def test_nan_on_one_rank_stops_both_unsaved(ranks) -> None:
    _, seen = ranks
    r0, r1 = seen[0]["guard_stop"], seen[1]["guard_stop"]
    _same_on_both(seen, "guard_stop", "step", "saved", "checkpoints", "latest", "param_hash")
    # rank 0's own loss at step 8 was finite, its weights already NaN (DDP's all-reduce)
    assert dict(map(tuple, r0["logged"]))[8] == pytest.approx(_losses(r0)[8])
    assert math.isfinite(_losses(r0)[8]) and math.isnan(_losses(r1)[8])
    assert not r0["params_finite"]
    # stopped where the step-8 checkpoint was due; that save and the stop save vetoed
    assert (
        r0["step"] == 8 and "non-finite" in r0["stop_reason"] and "step_000004" in r0["stop_reason"]
    )
    assert r0["stop_reason"] == r1["stop_reason"]
    assert r0["checkpoints"] == ["step_000004"] and r0["latest"] == "step_000004"


@pytest.mark.slow
def test_nan_on_one_rank_rolls_both_back_alike(ranks) -> None:
    _, seen = ranks
    r0, r1 = seen[0]["guard_rollback"], seen[1]["guard_rollback"]
    _same_on_both(
        seen, "guard_rollback", "step", "saved", "checkpoints", "param_hash", "stop_reason"
    )
    assert r0["step"] == 12 and r0["params_finite"]
    assert (
        r0["callbacks"]["LossGuard"]["rollbacks"] == r1["callbacks"]["LossGuard"]["rollbacks"] == 1
    )
    # steps 5..8 ran twice: after the rollback to step 4, on other (skipped-ahead) data
    logged_steps = [s for s, _ in r0["logged"]]
    assert logged_steps == [4, 5, 8, 5, 8, 10, 12]
    assert all(math.isfinite(loss) for _, loss in r1["logged"][3:])
    assert r0["checkpoints"] == ["step_000008", "step_000012"] and r0["temporaries"] == []


@pytest.mark.slow
def test_preemption_of_one_rank_then_resume_matches_uninterrupted(ranks) -> None:
    _, seen = ranks
    # SIGTERM reached rank 1 at step 5; the flag is agreed at log step 8
    _same_on_both(seen, "preempted", "step", "saved", "checkpoints", "latest", "param_hash")
    p0, p1 = seen[0]["preempted"], seen[1]["preempted"]
    assert p0["step"] == 8 and p1["stop_reason"] == "received SIGTERM (preemption)"
    assert p0["stop_reason"] == "requested on another rank"
    # checkpoints every 3 steps, keep_last=2, rotated by rank 0 only, plus the stop save
    assert p0["saved"] == ["step_000003", "step_000006", "step_000008"]
    assert p0["checkpoints"] == ["step_000006", "step_000008"] and p0["latest"] == "step_000008"
    assert p0["temporaries"] == []
    # every rank resumes from the same complete checkpoint and continues exactly
    _same_on_both(seen, "resumed", "resumed_from", "step", "checkpoints", "param_hash")
    assert seen[0]["resumed"]["resumed_from"].endswith("step_000008")
    for rank in (0, 1):
        full = _losses(seen[rank]["uninterrupted"])
        pieced = {**_losses(seen[rank]["preempted"]), **_losses(seen[rank]["resumed"])}
        assert sorted(pieced) == list(range(1, 13))
        assert pieced == full, f"rank {rank}: losses after the resume differ"
    assert seen[0]["resumed"]["param_hash"] == seen[0]["uninterrupted"]["param_hash"]
    assert seen[0]["uninterrupted"]["checkpoints"] == ["step_000009", "step_000012"]


@pytest.mark.slow
def test_early_stopping_and_logging_agree_and_rank_zero_writes(ranks) -> None:
    out, seen = ranks
    _same_on_both(seen, "early_stop", "step", "saved", "checkpoints", "param_hash")
    e0, e1 = seen[0]["early_stop"], seen[1]["early_stop"]
    # rank 1 alone ran out of patience at log step 6; both stopped at log step 8
    assert e0["step"] == 8 and e1["stop_reason"].startswith("early stopping: score")
    assert e0["stop_reason"] == "requested on another rank"
    assert e0["saved"] == ["step_000005", "step_000008"]
    lines = [
        json.loads(x) for x in (out / "early_stop/logs/metrics.jsonl").read_text().splitlines()
    ]
    train = [r["step"] for r in lines if "loss" in r]
    evals = [r["step"] for r in lines if "eval/loss" in r]
    assert train == [2, 4, 6, 8] and evals == [4, 8]  # once each: rank 0 only
    # rank 0's own view: its score kept improving
    assert all(r["score"] == -r["step"] for r in lines if "score" in r)
    assert all(r["throughput/tokens_per_s"] > 0 for r in lines if "loss" in r)
    assert not (out / "preempt/logs").exists()  # no logger there: nothing written
