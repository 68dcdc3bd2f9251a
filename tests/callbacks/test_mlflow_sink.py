"""The MLflow sink, read back with MLflow's own client from the store it wrote: params,
metric histories by step and phase, and a resume that continues the same MLflow run."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.callbacks import Checkpoint, CompositeLogger
from baton.core import Driver
from baton.core.cli.callback_flags import build_callback, parse_callback_flag
from baton.core.errors import UsageError
from support.scalar_backend import ScalarBackend


def scalar_run(run_dir: Path, max_steps: int, *, note: str = "first", resume: str = "none"):
    """The scalar backend with checkpoints every 3 steps, evaluations every 3, logging
    every step to JSON lines and MLflow (a file store in the run directory)."""
    logger = build_callback(parse_callback_flag("logger:sinks=[jsonl,mlflow]"))
    driver = Driver(
        ScalarBackend(lr=0.1),
        [Checkpoint(every_n_steps=3, keep_last=None), logger],
        max_steps=max_steps,
        log_every=1,
        eval_every=3,
        run_dir=run_dir,
        resume=resume,
        settings={"lr": 0.1, "seed": 0, "note": note},
    )
    driver.fit()
    return driver


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def test_params_and_metric_histories_read_back_and_resume_continues_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    from baton.callbacks.sinks.jsonl import read_jsonl

    first = scalar_run(tmp_path, 6)
    store = tmp_path / "logs" / "mlflow"
    assert store.is_dir()
    client = MlflowClient(tracking_uri=store.as_uri())
    (run,) = client.search_runs(
        [client.get_experiment_by_name("baton").experiment_id]  # pyright: ignore
    )
    run_id = run.info.run_id
    assert run.info.run_name == tmp_path.name and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "seed": "0", "note": "first"}
    jsonl = read_jsonl(tmp_path / "logs" / "metrics.jsonl")
    assert history(client, run_id, "loss") == [(int(r["step"]), r["loss"]) for r in jsonl]
    assert [s for s, _ in history(client, run_id, "eval/loss")] == [3, 6]
    assert [s for s, _ in history(client, run_id, "w")] == [1, 2, 3, 4, 5, 6]
    saved = (tmp_path / "checkpoints" / "step_000006" / "baton.json").read_text()
    assert run_id in saved  # the run id travels in the checkpoint

    # a resume with a changed setting continues the same MLflow run
    second = scalar_run(tmp_path, 9, note="second", resume="auto")
    assert second.resumed_from is not None and first.step == 6
    (again,) = client.search_runs([run.info.experiment_id])
    assert again.info.run_id == run_id and again.info.status == "FINISHED"
    assert again.data.params["note"] == "first"  # params cannot change: the change is a tag
    assert again.data.tags["baton.changed.note"] == "first -> second at step 6"
    jsonl = read_jsonl(tmp_path / "logs" / "metrics.jsonl")
    assert [s for s, _ in history(client, run_id, "loss")] == list(range(1, 10))
    assert history(client, run_id, "loss")[-1] == (9, jsonl[-1]["loss"])
    assert [s for s, _ in history(client, run_id, "eval/loss")] == [3, 6, 9]


def test_a_tracking_uri_by_flag_and_its_misuse(tmp_path: Path) -> None:
    uri = (tmp_path / "elsewhere").as_uri()
    flag = f"logger:sinks=[jsonl,mlflow],mlflow_tracking_uri={uri}"
    logger = build_callback(parse_callback_flag(flag))
    assert isinstance(logger, CompositeLogger) and logger.state_key == "logger"
    (mlflow,) = [s for s in logger.sinks if s.name == "mlflow"]
    assert mlflow.tracking_uri == uri  # pyright: ignore[reportAttributeAccessIssue]
    assert CompositeLogger(["jsonl"]).state_key is None  # no state without a stateful sink
    with pytest.raises(UsageError, match="no mlflow sink"):
        CompositeLogger(["jsonl"], mlflow_tracking_uri=uri)
