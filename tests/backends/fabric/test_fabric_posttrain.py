"""SFT and DPO on the Fabric backend (recipes/hf_finetune.py --objective sft|dpo): the
first step equals the references outside baton (transformers on each conversation alone;
TRL's DPOTrainer), packed rows keep documents apart, and wrong data is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from baton.backends.fabric.hf_posttrain import packed_loaders
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from baton.data import DataError
from baton.data.packed import PackedDataset
from support.posttrain import (
    LoggedMetrics,
    dpo_reference,
    posttrain_files,
    sft_reference,
    tiny_model,
)

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
SEQ_LEN = 96

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("posttrain"), SEQ_LEN, num_rows=12)


def first_rows(prefix: Path, batch_size: int, steps_rows: int) -> list[int]:
    """The rows the recipe's first step reads: the head of its seeded global order."""
    data = PackedDataset(prefix)
    train, _ = packed_loaders(data, batch_size=batch_size, seed=0, pad_id=0)
    return train.order(0)[:steps_rows].tolist()


def run(files: dict[str, Path], tmp_path: Path, *args: str) -> LoggedMetrics:
    argv = ["--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"])]
    argv += ["--max-steps", "1", "--log-every", "1", "--eval-every", "0", "--save-every", "0"]
    argv += ["--run-dir", str(tmp_path / "run"), "--no-progress", *args]
    driver = build_driver(RECIPE, argv)
    record = LoggedMetrics()
    driver.callbacks.append(record)
    driver.fit()
    return record


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_sft_first_step_equals_transformers_on_each_conversation(files, tmp_path, grad_accum):
    batch_size = 4 if grad_accum == 1 else 2
    record = run(
        files, tmp_path, "--objective", "sft", "--data-path", str(files["sft"]),
        "--batch-size", str(batch_size), "--grad-accum", str(grad_accum),
    )  # fmt: skip
    rows = first_rows(files["sft"], batch_size, batch_size * grad_accum)
    loss, grad_norm = sft_reference(files["policy"], files["sft"], rows)
    assert record.metrics[1]["loss"] == pytest.approx(loss, rel=1e-5)
    assert record.metrics[1]["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_first_step_equals_trl(files, tmp_path, loss_type):
    beta = 0.2
    record = run(
        files, tmp_path, "--objective", "dpo", "--data-path", str(files["pairs"]),
        "--reference", str(files["reference"]), "--dpo-beta", str(beta), "--dpo-loss", loss_type,
        "--batch-size", "4",
    )  # fmt: skip
    rows = first_rows(files["pairs"], 4, 4)
    trl = dpo_reference(files["policy"], files["reference"], files["pairs"], rows, beta, loss_type)
    got = record.metrics[1]
    assert got["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    scale = max(abs(trl["logps/chosen"]), abs(trl["logps/rejected"]))
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        # differences of fp32 sums: an absolute tolerance of 1e-5 of the sums' size
        assert got[name] == pytest.approx(trl[name], abs=beta * scale * 1e-5), name
    assert got["rewards/accuracies"] == pytest.approx(trl["rewards/accuracies"])
    for name in ("logps/chosen", "logps/rejected"):
        assert got[name] == pytest.approx(trl[name], rel=1e-5), name

    # the reference's log-probabilities are stored beside the data, tied to it
    stored = sorted(files["pairs"].parent.glob("pairs.reference-*.json"))
    assert stored, "no reference log-probabilities beside the data"
    record_json = json.loads(stored[-1].read_text())
    assert record_json["engine"] == "fabric"


def test_packed_rows_give_each_document_its_own_logits(files):
    """transformers keeps attention inside each document when position_ids restart (and
    no KV cache is asked for: with one it does not look for packed documents)."""
    from transformers import AutoModelForCausalLM

    from baton.backends.fabric.posttrain import PackedRows

    data = PackedDataset(files["sft"])
    model = AutoModelForCausalLM.from_pretrained(files["policy"], dtype=torch.float32).eval()
    item = PackedRows(data, pad_id=0)[0]
    with torch.no_grad():
        packed = model(
            input_ids=item["input_ids"][None],
            position_ids=item["position_ids"][None],
            use_cache=False,
        ).logits[0]
        start, inputs = 0, sum(len(tokens) for tokens, _ in data.row(0)) - 1
        for tokens, _ in data.row(0):
            ids = torch.as_tensor(tokens.astype("int64"))[None]
            alone = model(input_ids=ids).logits[0]
            n = min(len(tokens), inputs - start)  # the row's last token is no input
            torch.testing.assert_close(packed[start : start + n], alone[:n], rtol=1e-5, atol=1e-5)
            start += len(tokens)
    assert len(data.row(0)) >= 2


def test_wrong_data_for_the_objective_is_refused(files, tmp_path):
    with pytest.raises(DataError, match="--objective sft"):
        run(files, tmp_path, "--objective", "dpo", "--data-path", str(files["sft"]))
    with pytest.raises(DataError, match="--objective pretrain"):
        run(files, tmp_path, "--data-path", str(files["sft"]))
    with pytest.raises(UsageError, match="--objective"):
        run(files, tmp_path, "--objective", "rlhf", "--data-path", str(files["sft"]))
    assert not (tmp_path / "run").exists()


def test_the_cli_refuses_sft_data_for_dpo_in_one_line(files, tmp_path, capsys):
    from baton.core.cli.command import main as baton

    argv = ["run", str(RECIPE), "--objective", "dpo", "--data-path", str(files["sft"])]
    argv += ["--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"])]
    assert baton([*argv, "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--objective sft" in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_reference_of_another_architecture_is_refused(files, tmp_path):
    other = tiny_model(tmp_path / "qwen", family="qwen3")
    with pytest.raises(UsageError, match="same architecture"):
        run(
            files, tmp_path, "--objective", "dpo", "--data-path", str(files["pairs"]),
            "--reference", str(other),
        )  # fmt: skip


def logged_first_step(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").open()]
    return next(row for row in rows if row.get("step") == 1 and "loss" in row)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_two_ddp_ranks_equal_the_references(files, tmp_path, objective):
    """Under torchrun (2 ranks, gloo) a step's loss is the mean over both ranks' batches:
    the same as the references on all the step's rows."""
    from support.torchrun import torchrun

    cli = ROOT / "packages" / "core" / "src" / "baton" / "core" / "cli" / "command.py"
    data = files["sft"] if objective == "sft" else files["pairs"]
    extra = ["--reference", str(files["reference"])] if objective == "dpo" else []
    torchrun(
        cli, "run", str(RECIPE), "--objective", objective, "--data-path", str(data),
        "--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"]), *extra,
        "--batch-size", "2", "--max-steps", "1", "--log-every", "1", "--eval-every", "0",
        "--save-every", "0", "--no-progress", "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    got = logged_first_step(tmp_path / "run")
    rows = first_rows(data, batch_size=2, steps_rows=4)  # both ranks' rows of step 1
    if objective == "sft":
        loss, grad_norm = sft_reference(files["policy"], data, rows)
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
        assert got["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    else:
        trl = dpo_reference(files["policy"], files["reference"], data, rows, 0.1, "sigmoid")
        assert got["loss"] == pytest.approx(trl["loss"], rel=1e-5)
        assert got["logps/chosen"] == pytest.approx(trl["logps/chosen"], rel=1e-5)
        assert got["rewards/accuracies"] == pytest.approx(trl["rewards/accuracies"])


@pytest.mark.slow
def test_sft_killed_between_saves_resumes_bitwise(files, tmp_path):
    """An SFT run SIGKILLed after its step-3 checkpoint and resumed ends at step 6 with
    the weights and optimizer state of the run that was never stopped."""
    import signal
    import subprocess
    import sys

    from support.states import assert_bitwise_equal, load_state

    flags = ["--objective", "sft", "--data-path", str(files["sft"]), "--init-from",
             str(files["policy"]), "--tokenizer", str(files["tokenizer"]), "--batch-size", "2",
             "--log-every", "1", "--eval-every", "0", "--save-every", "3", "--no-progress"]  # fmt: skip
    straight = tmp_path / "straight"
    run_args = [sys.executable, "-m", "baton.core.cli.command", "run", str(RECIPE), *flags]
    done = subprocess.run(
        [*run_args, "--max-steps", "6", "--run-dir", str(straight)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    killer = ROOT / "tests" / "support" / "killed_run.py"
    done = subprocess.run(
        [sys.executable, str(killer), "--saved", "3", "--next-save", "6", str(RECIPE), *flags,
         "--max-steps", "1000", "--run-dir", str(killed)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stdout[-2000:] + done.stderr[-3000:]
    done = subprocess.run(
        [*run_args, "--max-steps", "6", "--run-dir", str(killed), "--resume", "auto",
         "--allow-changed", "max_steps"],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr

    a = load_state(straight / "checkpoints" / "step_000006")
    b = load_state(killed / "checkpoints" / "step_000006")
    for part in ("model", "optimizer"):
        assert_bitwise_equal(a[part], b[part], part)


def test_resuming_dpo_with_a_changed_reference_is_refused(files, tmp_path):
    import shutil

    reference = tmp_path / "reference"
    shutil.copytree(files["reference"], reference)
    args = ["--objective", "dpo", "--data-path", str(files["pairs"]), "--batch-size", "2",
            "--reference", str(reference)]  # fmt: skip
    run(files, tmp_path, *args)
    shutil.rmtree(reference)
    shutil.copytree(files["policy"], reference)  # other weights at the same path
    with pytest.raises(UsageError, match="reference_fingerprint"):
        run(files, tmp_path, *args, "--max-steps", "2", "--resume", "auto")


@pytest.mark.slow
def test_prepared_chat_jsonl_trains_sft_then_dpo(files, tmp_path):
    """The documented path: `baton data prepare` of a chat .jsonl and of pairs, SFT on
    the conversations, then DPO on the pairs from the SFT export."""
    from baton.core.cli.command import main as baton
    from support.posttrain import conversations, preference_pairs

    chats, pairs = tmp_path / "chat.jsonl", tmp_path / "pairs.jsonl"
    chats.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations(40)))
    pairs.write_text("".join(json.dumps(p) + "\n" for p in preference_pairs(40)))
    tok = str(files["tokenizer"])
    for source, output in ((chats, "chat"), (pairs, "prefs")):
        argv = ["data", "prepare", str(source), "--tokenizer", tok, "--seq-len", "128"]
        assert baton([*argv, "--output", str(tmp_path / output)]) == 0
    common = ["--tokenizer", tok, "--batch-size", "2", "--max-steps", "2", "--log-every", "1",
              "--eval-every", "0", "--save-every", "2", "--no-progress"]  # fmt: skip
    sft_run = tmp_path / "sft"
    assert baton(["run", str(RECIPE), "--objective", "sft", "--data-path",
                  str(tmp_path / "chat"), "--init-from", str(files["policy"]), *common,
                  "--run-dir", str(sft_run)]) == 0  # fmt: skip
    export = tmp_path / "sft-export"
    assert baton(["export", str(sft_run / "checkpoints" / "step_000002"), "--format", "hf",
                  str(export)]) == 0  # fmt: skip
    assert baton(["run", str(RECIPE), "--objective", "dpo", "--data-path",
                  str(tmp_path / "prefs"), "--init-from", str(export), *common,
                  "--run-dir", str(tmp_path / "dpo")]) == 0  # fmt: skip
    first = logged_first_step(tmp_path / "dpo")
    # the reference is the starting weights: every pair's first loss is ln 2
    assert first["loss"] == pytest.approx(0.6931471805599453, rel=1e-5)
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
