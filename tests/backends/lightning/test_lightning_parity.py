"""LightningModules as Lightning's documentation writes them, under baton's LightningBackend:
each batch's loss, each learning rate and each validation's metrics equal
``lightning.pytorch.Trainer.fit``'s bit for bit, with validation on, and again after a
resume in a fresh process. The modules and their Trainer settings: ``lightning_corpus.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import lightning_corpus as corpus  # noqa: E402

#: where each case's first run saves: mid-epoch, or at an epoch's end (validation done,
#: the epoch's end hooks and plateau schedulers still to run)
SAVE_AT = {"batchnorm": 13, "lm": 12, "plateau": 16, "clipping": 18, "gan": 11}


def resume_in_fresh_process(name: str, run_dir: Path, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(HERE / "lightning_corpus.py"), name, str(run_dir), str(out)],
        check=True,
        env=env,
        timeout=600,
    )
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", sorted(SAVE_AT))
def test_equals_trainer_fit_and_again_after_a_resume_in_a_fresh_process(name, tmp_path):
    case = corpus.CASES[name]
    expected = corpus.trainer_fit(name, tmp_path / "trainer")
    record, seen = corpus.baton_fit(name, tmp_path / "baton")

    assert len(expected.losses) >= 30
    assert record.losses == expected.losses
    assert record.lrs == expected.lrs
    assert len(expected.validations) >= 4
    assert record.validations == expected.validations
    # the driver's evaluation phase carries the same values, under the module's names
    steps = sorted(seen.evals)
    assert steps == list(range(case.eval_every, case.steps + 1, case.eval_every))
    assert [seen.evals[s]["val_loss"] for s in steps] == [
        v["val_loss"] for v in expected.validations
    ]

    run_dir = tmp_path / "resumed"
    corpus.baton_fit(name, run_dir, SAVE_AT[name], save_at=SAVE_AT[name])
    resumed = resume_in_fresh_process(name, run_dir, tmp_path / "resumed.json")
    assert resumed["steps"] == list(range(SAVE_AT[name] + 1, case.steps + 1))
    tail = len(resumed["losses"])
    assert tail > 0 and resumed["losses"] == expected.losses[-tail:]
    later = len(resumed["validations"])
    assert later > 0 and resumed["validations"] == expected.validations[-later:]


def test_the_corpus_exercises_what_it_claims(tmp_path):
    """The LM's epochs end on a partial accumulation window and OneCycleLR moves the rate;
    the plateau scheduler really reduced the rate."""
    lm = corpus.trainer_fit("lm", tmp_path / "lm")
    assert len(lm.losses) == 80  # 8 epochs of 10 batches: windows 3+3+3+1
    assert len(set(lm.lrs)) > 10
    plateau = corpus.trainer_fit("plateau", tmp_path / "plateau")
    assert min(plateau.lrs) < max(plateau.lrs) == 0.05
