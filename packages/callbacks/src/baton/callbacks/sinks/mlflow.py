"""MLflow through the real ``mlflow`` library: a local store in the run directory, or
any tracking server.

Example::

    CompositeLogger(["jsonl", MlflowSink()])   # <run_dir>/logs/mlflow, a file store
    CompositeLogger([MlflowSink(tracking_uri="http://localhost:5000", experiment="lm")])
    # baton run recipes/quickstart.py --callback logger:sinks=[jsonl,mlflow]
    # later: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri runs/quickstart/logs/mlflow

The tracking URI is the one given, else ``$MLFLOW_TRACKING_URI``, else a file store in
``<run_dir>/logs/mlflow`` (what ``mlflow-skinny`` records offline; baton allows MLflow's
file store for that directory by setting ``MLFLOW_ALLOW_FILE_STORE`` when it is unset).
The recipe's settings become the run's params; training metrics are logged under their
own keys (``loss``, ``optim/lr``) and evaluations under ``eval/...``, each at its step.
The MLflow run id is part of the logger's checkpointed state, so a resumed baton run
continues the same MLflow run; a setting changed on resume (``--allow-changed``) is
recorded as the tag ``baton.changed.KEY`` (MLflow params cannot change). MLflow keeps
every point: steps redone after a kill appear twice in a metric's history, the later
one from the resumed run. Only rank 0 logs.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase
    from baton.core import DriverView

#: characters MLflow refuses in metric and param keys become ``_``
_INVALID_KEY_CHARS = re.compile(r"[^\w\-. /]")
#: MLflow's limits on a param value and on the entries of one ``log_batch``
_MAX_PARAM_VALUE = 6000
_BATCH = 100


class MlflowSink:
    """Log params and metrics to an MLflow run, continued on resume.

    Args:
        tracking_uri: where MLflow records (default: ``$MLFLOW_TRACKING_URI``, else
            ``<run_dir>/logs/mlflow``).
        experiment: the MLflow experiment, created when missing.
        run_name: the MLflow run's name (default: the run directory's name).
    """

    name = "mlflow"

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment: str = "baton",
        run_name: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.run_id: str | None = None
        self._client: Any = None

    # -- state (kept by CompositeLogger in every checkpoint) --------------------
    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state.get("run_id")

    # -- sink ------------------------------------------------------------------
    def open(self, driver: DriverView) -> None:
        if not driver.is_global_zero:
            return
        from mlflow.tracking import MlflowClient

        if self.tracking_uri is None:
            self.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or local_store(
                Path(driver.log_dir) / "mlflow"
            )
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        settings = {clean_key(k): param_value(v) for k, v in driver.options.settings.items()}
        run_name = self.run_name or Path(driver.options.run_dir).name
        if self.run_id is not None and driver.resumed_from is not None:
            self._continue(settings, int(driver.step), run_name)
        else:
            self._start(settings, run_name)

    def _start(self, settings: dict[str, str], run_name: str) -> None:
        experiment = self._client.get_experiment_by_name(self.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(self.experiment)
        )
        self.run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        self._log_params(settings)

    def _continue(self, settings: dict[str, str], step: int, run_name: str) -> None:
        """Reopen the recorded run: new settings become params, changed ones tags. A run
        this tracking URI does not hold (another server) is started afresh."""
        from mlflow.exceptions import MlflowException

        try:
            known: dict[str, str] = self._client.get_run(self.run_id).data.params
        except MlflowException:
            self._start(settings, run_name)
            return
        self._client.update_run(self.run_id, status="RUNNING")
        self._log_params({k: v for k, v in settings.items() if k not in known})
        for key, value in settings.items():
            if key in known and known[key] != value:
                note = f"{known[key]} -> {value} at step {step}"
                self._client.set_tag(self.run_id, f"baton.changed.{key}", note)

    def _log_params(self, settings: dict[str, str]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in settings.items()]
        for start in range(0, len(params), _BATCH):
            self._client.log_batch(self.run_id, params=params[start : start + _BATCH])

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None:
        if self._client is None:
            return
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        rows = [Metric(clean_key(k), float(v), stamp, step) for k, v in metrics.items()]
        for start in range(0, len(rows), _BATCH):
            self._client.log_batch(self.run_id, metrics=rows[start : start + _BATCH])

    def close(self) -> None:
        if self._client is not None:
            self._client.set_terminated(self.run_id)
            self._client = None


def local_store(directory: Path) -> str:
    """The ``file:`` URI of an MLflow file store in ``directory``, allowed for this
    process (MLflow 3 asks ``MLFLOW_ALLOW_FILE_STORE=true`` of file stores)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return directory.resolve().as_uri()


def clean_key(key: str) -> str:
    """A metric or param key MLflow accepts: ``"a:b"`` -> ``"a_b"``."""
    return _INVALID_KEY_CHARS.sub("_", key)


def param_value(value: Any) -> str:
    """A setting as an MLflow param value (text, at most MLflow's 6000 characters)."""
    return str(value)[:_MAX_PARAM_VALUE]
