"""MaxText's own Grain pipeline (mmap over a prepared dataset, a BPE tokenizer) under baton.

One baton run of ``recipes/maxtext_tiny.py --tokenizer DIR --data-path PREFIX`` (10 steps,
an asynchronous save at step 5 with the Grain iterator's state, as MaxText saves it) is
shared by the tests here:

* the loss falls on real BPE tokens read by MaxText's ``grain_file_type=mmap`` source;
* parity: MaxText's own ``train.train_loop`` on the same config (the same prepared data,
  the same pipeline) gives the same per-step losses, bit for bit;
* resume: a fresh process resumes from step 5 and reproduces steps 6-10 exactly, the
  Grain iterator restored from the checkpoint's ``iter`` item;
* bad input: a tokenizer other than the data's (both fingerprints named).

The tokenizer and the dataset are built in a subprocess (megatron-core's builder needs
torch, which this process never imports).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from backends.maxtext.maxtext_support import outside_driver, record_save_handles

from baton.data import DataError

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parents[2] / "recipes" / "maxtext_tiny.py"
STEPS = 10
SAVE_AT = 5


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("prepared")
    done = subprocess.run(
        [sys.executable, str(HERE / "prepared_data.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"tokenizer": out / "tok", "prefix": out / "corpus"}


def _argv(prepared: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        f"--tokenizer={prepared['tokenizer']}",
        f"--data-path={prepared['prefix']}",
        f"--max-steps={STEPS}",
        "--log-every=1",
        "--no-progress",
        "--no-print-loss",
        f"--run-dir={run_dir}",
        *extra,
    ]


@pytest.fixture(scope="module")
def native_run(
    prepared: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    from baton.core import Callback
    from baton.core.cli.recipe import build_driver

    run_dir = tmp_path_factory.mktemp("native_run")
    losses: dict[int, float] = {}

    class Record(Callback):
        def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
            if "loss" in metrics:
                losses[driver.step] = metrics["loss"]

    driver = build_driver(RECIPE, _argv(prepared, run_dir, f"--save-every={SAVE_AT}"))
    driver.callbacks.append(Record())
    handles = record_save_handles(driver.backend)
    result = driver.fit()
    return {
        "driver": driver,
        "result": result,
        "losses": losses,
        "run_dir": run_dir,
        "save_handles": handles,
    }


def test_grain_mmap_run_trains_on_bpe_tokens(native_run: dict[str, Any]) -> None:
    config = native_run["driver"].backend.config
    merged = config.merged()
    assert merged["dataset_type"] == "grain" and merged["grain_file_type"] == "mmap"
    assert merged["tokenizer_type"] == "huggingface" and merged["vocab_size"] == 512
    losses = native_run["losses"]
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1] - 0.25, losses  # real tokens: the loss falls
    first = native_run["result"].checkpoints[0] / "backend"
    iterator_state = list((first / "checkpoint" / str(SAVE_AT - 1) / "iter").glob("process_*"))
    assert [p.name for p in iterator_state] == ["process_0-of-1.json"]
    assert json.loads((first / "data.json").read_text()) == {
        "pipeline": "grain",
        "consumed": SAVE_AT,
    }


def test_losses_equal_maxtext_train_loop_on_its_own_pipeline(
    native_run: dict[str, Any], tmp_path: Path
) -> None:
    from maxtext.trainers.pre_train import train

    config = native_run["driver"].backend.config
    metrics_file = tmp_path / "metrics.jsonl"
    argv = config.argv(
        {
            "run_name": "reference",
            "base_output_directory": str(tmp_path),
            "jax_cache_dir": str(native_run["run_dir"] / "jax_cache"),
            "metrics_file": str(metrics_file),
        }
    )
    with outside_driver(config):
        hparams, recorder = train.initialize(argv)
        train.train_loop(hparams, recorder)
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    reference = {int(row["step"]) + 1: row["learning/loss"] for row in rows}
    assert reference == native_run["losses"]


def test_resume_in_fresh_process_restores_the_grain_iterator(
    native_run: dict[str, Any], prepared: dict[str, Path], tmp_path: Path
) -> None:
    checkpoint = native_run["result"].checkpoints[0]
    out = tmp_path / "resumed.json"
    argv = _argv(
        prepared,
        tmp_path / "resumed",
        "--save-every=0",
        "--no-callback=checkpoint",
        f"--resume={checkpoint}",
        f"--overrides=jax_cache_dir={native_run['run_dir'] / 'jax_cache'}",
    )
    command = [sys.executable, str(HERE / "run_recipe.py"), str(out), str(RECIPE), *argv]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    resumed = {int(k): v for k, v in json.loads(out.read_text())["losses"].items()}
    assert sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1))
    assert resumed == {s: native_run["losses"][s] for s in resumed}
    # the step-5 save ran on the writer thread with the Grain iterator's position taken
    # in the loop (FrozenIteratorState)
    assert native_run["save_handles"] == ["FuturePendingSave", "FuturePendingSave"]


def test_blend_becomes_maxtexts_mmap_mixture(prepared: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    from baton.backends.maxtext import MaxTextConfig

    other = tmp_path / "copy"
    for suffix in (".bin", ".idx", ".json"):
        shutil.copy(str(prepared["prefix"]) + suffix, str(other) + suffix)
    for spec in (f"0.7 {prepared['prefix']} 0.3 {other}", f"{prepared['prefix']},0.7;{other},0.3"):
        config = MaxTextConfig(
            data_path=spec, tokenizer=str(prepared["tokenizer"]), overrides={"vocab_size": 512}
        )
        merged = config.merged()
        assert merged["grain_train_files"] == f"{prepared['prefix']},0.7;{other},0.3"
    (tmp_path / "copy.idx").unlink()
    config = MaxTextConfig(
        data_path=f"0.7 {prepared['prefix']} 0.3 {other}",
        tokenizer=str(prepared["tokenizer"]),
        overrides={"vocab_size": 512},
    )
    with pytest.raises(DataError, match=r"copy"):
        config.merged()


def test_tokenizer_other_than_the_datas_is_refused(
    prepared: dict[str, Path], tmp_path: Path
) -> None:
    from baton.backends.maxtext import MaxTextConfig
    from baton.data import train_tokenizer

    other = train_tokenizer(tmp_path / "other", vocab_size=300)
    config = MaxTextConfig(
        data_path=str(prepared["prefix"]), tokenizer=str(other.path), overrides={"vocab_size": 512}
    )
    with pytest.raises(DataError, match=other.fingerprint[:16]) as error:
        config.argv()
    manifest = json.loads(Path(str(prepared["prefix"]) + ".json").read_text())
    assert manifest["tokenizer"]["fingerprint"][:16] in str(error.value)  # the data's, too
    assert str(prepared["prefix"]) in str(error.value)


def test_hf_json_pipeline_trains_and_resumes_at_its_position(
    native_run: dict[str, Any], prepared: dict[str, Path], tmp_path: Path
) -> None:
    """MaxText's Hugging Face pipeline on a local JSON Lines file, tokenized on the fly by
    the same tokenizer; MaxText saves no state for it, so baton replays the stream's
    position on resume: the resumed steps repeat the uninterrupted run's losses."""
    from baton.core import Callback
    from baton.core.cli.recipe import build_driver
    from baton.data.corpus import reference_documents

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in reference_documents()))

    def run(run_dir: Path, *extra: str) -> tuple[Any, dict[int, float]]:
        losses: dict[int, float] = {}

        class Record(Callback):
            def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
                if "loss" in metrics:
                    losses[driver.step] = metrics["loss"]

        argv = [
            f"--tokenizer={prepared['tokenizer']}",
            f"--data-path={data}",
            "--max-steps=4",
            "--log-every=1",
            "--no-progress",
            "--no-print-loss",
            f"--run-dir={run_dir}",
            f"--overrides=jax_cache_dir={native_run['run_dir'] / 'jax_cache'}",
            *extra,
        ]
        driver = build_driver(RECIPE, argv)
        driver.callbacks.append(Record())
        return driver.fit(), losses

    first, losses = run(tmp_path / "hf", "--save-every=2", "--no-async-save")
    assert sorted(losses) == [1, 2, 3, 4]
    position = json.loads((first.checkpoints[0] / "backend" / "data.json").read_text())
    assert position == {"pipeline": "hf", "consumed": 2}
    _, resumed = run(
        tmp_path / "hf_resumed",
        "--save-every=0",
        "--no-callback=checkpoint",
        f"--resume={first.checkpoints[0]}",
    )
    assert resumed == {3: losses[3], 4: losses[4]}


def test_evaluation_on_maxtexts_pipeline_or_refused(
    native_run: dict[str, Any], prepared: dict[str, Path], tmp_path: Path
) -> None:
    """A requested evaluation is never skipped: with --eval-data-path MaxText's own
    pipeline evaluates (a fixed set of its eval batches); without it the run is refused
    before anything is built, naming the flag."""
    from baton.core import Callback
    from baton.core.cli.recipe import build_driver
    from baton.core.errors import UsageError

    evals: dict[int, float] = {}

    class Record(Callback):
        def on_eval_end(self, driver: Any, metrics: dict[str, float]) -> None:
            evals[driver.step] = metrics["eval/loss"]

    cache = f"--overrides=jax_cache_dir={native_run['run_dir'] / 'jax_cache'}"
    argv = [
        f"--tokenizer={prepared['tokenizer']}",
        f"--data-path={prepared['prefix']}",
        "--max-steps=4",
        "--no-progress",
        "--no-print-loss",
        "--save-every=0",
        "--no-callback=checkpoint",
        cache,
    ]
    with pytest.raises(UsageError, match="--eval-data-path"):
        build_driver(RECIPE, [*argv, "--eval-every=2", f"--run-dir={tmp_path / 'no'}"])
    driver = build_driver(
        RECIPE,
        [*argv, "--eval-every=2", f"--eval-data-path={prepared['prefix']}",
         f"--run-dir={tmp_path / 'eval'}"],
    )  # fmt: skip
    assert driver.backend.config.merged()["grain_eval_files"] == str(prepared["prefix"])
    driver.callbacks.append(Record())
    driver.fit()
    assert sorted(evals) == [2, 4] and all(0 < v < 20 for v in evals.values())
    assert evals[4] < evals[2]
