"""Post-training on MaxText (``recipes/maxtext_tiny.py --objective sft|dpo``): on the same
weights and prepared data, the first step's SFT loss and gradient norm equal
``transformers`` computing each conversation alone, and the first DPO loss and metrics
equal TRL's ``DPOTrainer``, in fp32. Data of the wrong kind is refused before MaxText
builds anything."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("maxtext")

from baton.core.cli.recipe import build_driver
from baton.data import DataError
from support.posttrain import (
    DPO_METRICS,
    LoggedMetrics,
    chat_tokenizer,
    dpo_reference,
    preference_prefix,
    sft_prefix,
    sft_reference,
    tiny_model,
)

RECIPE = Path(__file__).parents[3] / "recipes" / "maxtext_tiny.py"
SEQ, ROWS = 128, 8  # one global batch holds every row: the first step sees them all


def first_step(run_dir: Path, *flags: str) -> dict[str, float]:
    """The metrics of one fp32 step on all ``ROWS`` rows."""
    logged = LoggedMetrics()
    driver = build_driver(RECIPE, [
        "--max-steps", "1", "--log-every", "1", "--save-every", "0",
        "--no-callback", "checkpoint", "--batch-size", str(ROWS), "--seq-len", str(SEQ),
        "--run-dir", str(run_dir), "--no-progress", *flags,
        "--overrides", "dtype=float32", "matmul_precision=highest",
    ])  # fmt: skip
    driver.callbacks.append(logged)
    driver.fit()
    return logged.metrics[1]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_tokenizer(tmp_path_factory.mktemp("tok"))


def test_sft_first_loss_and_grad_norm_equal_transformers_unpacked(tmp_path, tokenizer):
    """Packed rows, documents kept apart by MaxText's segment ids and positions, the
    prompt's targets weighed 0 in ``targets_segmentation``: MaxText's own step and loss.
    A Qwen3 (its query kernel is Hugging Face's, unscaled, so the gradients compare)."""
    model = tiny_model(tmp_path / "model", family="qwen3")
    prefix = sft_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=ROWS)
    first = first_step(
        tmp_path / "run", "--objective", "sft", "--init-from", str(model),
        "--tokenizer", str(tokenizer), "--data-path", str(prefix),
    )  # fmt: skip
    loss, grad_norm = sft_reference(model, prefix, range(ROWS))
    assert first["loss"] == pytest.approx(loss, rel=1e-5)
    assert first["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    assert first["total_weights"] < ROWS * SEQ / 2  # the prompts and padding weigh nothing


@pytest.mark.parametrize("loss_type", ["sigmoid", pytest.param("ipo", marks=pytest.mark.slow)])
def test_dpo_first_loss_and_metrics_equal_trl(tmp_path, tokenizer, loss_type):
    """The reference (another model) is evaluated once by MaxText before training and
    stored beside the data; the policy's first loss and TRL's metrics equal TRL's."""
    policy = tiny_model(tmp_path / "policy", family="llama", seed=0)
    reference = tiny_model(tmp_path / "reference", family="llama", seed=1)
    prefix = preference_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=ROWS)
    first = first_step(
        tmp_path / "run", "--objective", "dpo", "--init-from", str(policy),
        "--reference", str(reference), "--dpo-beta", "0.2", "--dpo-loss", loss_type,
        "--tokenizer", str(tokenizer), "--data-path", str(prefix),
    )  # fmt: skip
    expected = dpo_reference(policy, reference, prefix, range(ROWS), 0.2, loss_type)
    assert first["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    for name in DPO_METRICS:
        assert first[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-6), name
    stored = sorted(p.name for p in prefix.parent.glob("pairs.reference-*"))
    assert [Path(name).suffix for name in stored] == [".json", ".npy"]
    assert not any(name.startswith("activ_") for name in first)  # not asked for


def test_wrong_kind_of_data_is_refused_before_the_model_is_built(tmp_path, tokenizer):
    prefix = sft_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=2)
    base = ["--max-steps", "1", "--run-dir", str(tmp_path / "run"), "--tokenizer", str(tokenizer)]
    with pytest.raises(DataError, match="--objective sft"):
        build_driver(RECIPE, [*base, "--data-path", str(prefix)])
    with pytest.raises(DataError, match="--objective sft"):
        build_driver(RECIPE, [*base, "--data-path", str(prefix), "--objective", "dpo"])
    with pytest.raises(DataError, match=f"pass --seq-len {SEQ}"):
        build_driver(RECIPE, [*base, "--data-path", str(prefix), "--objective", "sft",
                              "--seq-len", "64"])  # fmt: skip
    from baton.tools.data.prepare import prepare

    corpus = tmp_path / "corpus.jsonl"  # pretraining text, prepared with the same tokenizer
    corpus.write_text("".join(f'{{"text": "the model reads {i}"}}\n' for i in range(20)))
    text = tmp_path / "text"
    prepare([corpus], tokenizer, text, workers=1)
    with pytest.raises(DataError, match="pretraining text"):
        build_driver(RECIPE, [*base, "--data-path", str(text), "--objective", "sft"])
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_dpo_from_the_starting_weights_resumes_on_the_stored_reference(tmp_path, tokenizer):
    """Without --reference the reference is the starting weights: the first loss is ln 2
    and every reward 0. A resume from the step-1 checkpoint reads the stored reference
    values and continues with the uninterrupted run's step-2 loss. A checkpoint as both
    the starting weights and the reference gives ln 2 again (MaxText loads it twice)."""
    import math

    policy = tiny_model(tmp_path / "policy", family="llama")
    prefix = preference_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=ROWS)
    flags = [
        "--objective", "dpo", "--model-config", str(policy), "--tokenizer", str(tokenizer),
        "--data-path", str(prefix), "--batch-size", "4", "--lr", "1e-2",
    ]  # fmt: skip

    def run(name: str, *extra: str, steps: int = 2) -> dict[int, dict[str, float]]:
        logged = LoggedMetrics()
        driver = build_driver(RECIPE, [
            "--max-steps", str(steps), "--log-every", "1", "--seq-len", str(SEQ), "--no-progress",
            "--run-dir", str(tmp_path / name), *flags, *extra,
            "--overrides", "dtype=float32", f"jax_cache_dir={tmp_path / 'jax_cache'}",
        ])  # fmt: skip
        driver.callbacks.append(logged)
        driver.fit()
        return logged.metrics

    whole = run("whole", "--init-from", str(policy), "--save-every", "1", "--no-async-save")
    assert whole[1]["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert whole[1]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert whole[2]["loss"] != pytest.approx(math.log(2), rel=1e-4)  # the policy moved
    stored = list(prefix.parent.glob("pairs.reference-*.npy"))
    written = stored[0].stat().st_mtime_ns
    checkpoint = tmp_path / "whole" / "checkpoints" / "step_000001"
    resumed = run(
        "resumed", "--init-from", str(policy), "--save-every", "0", f"--resume={checkpoint}"
    )
    assert sorted(resumed) == [2]
    assert resumed[2]["loss"] == whole[2]["loss"]
    assert list(prefix.parent.glob("pairs.reference-*.npy")) == stored
    assert stored[0].stat().st_mtime_ns == written  # read, not computed again
    again = run("again", "--save-every", "0", "--init-from", str(checkpoint),
                "--reference", str(checkpoint), steps=1)  # fmt: skip
    assert again[1]["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert again[1]["logps/chosen"] != pytest.approx(whole[1]["logps/chosen"], rel=1e-4)
