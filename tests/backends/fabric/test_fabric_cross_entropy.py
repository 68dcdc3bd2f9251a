"""The chunked cross entropy on Fabric (``fabric/cross_entropy.py``) equals the full
float32 logits on real ``transformers`` models: SFT's loss, DPO's and GRPO's declared
losses and metrics, each step's gradient norm (within 1e-6, fp32, CPU), and the targets'
log-probabilities and entropy, on packed rows with ignored targets, for chunk sizes that
do and do not divide the rows' tokens, on an untied Llama, a tied-embedding Qwen3 and a
Qwen3-MoE (with its load-balancing term), and inside sharded models; the recipe runs
each path a CPU can run (``auto`` there is the full logits) and refuses a bad
``--cross-entropy`` in one line."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from baton.backends.fabric.cross_entropy import (
    FULL,
    CrossEntropy,
    liger_installed,
    resolve_cross_entropy,
    target_logps,
)
from baton.backends.fabric.hf_posttrain import packed_loaders
from baton.backends.fabric.moe import RouterBalance
from baton.backends.fabric.objective_loss import ObjectiveItems, ObjectiveLoss, model_inputs
from baton.backends.fabric.posttrain import MoECrossEntropyLoss, cross_entropy_loss
from baton.backends.fabric.step import WeightedMean
from baton.backends.torch_logps import IGNORE, token_entropy, token_logps
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from baton.core.objectives import ObjectiveRun
from baton.data.packed import PackedDataset
from support.grpo import grpo_flags
from support.posttrain import LoggedMetrics, dpo_reference, posttrain_files, sft_reference
from support.tiny_qwen3 import TINY_EXPERTS, TINY_QWEN3, save_tiny_qwen3

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
VOCAB, SEQ = 1000, 30
#: each row's documents (lengths), the second row's filling it, the first's padded
DOCUMENTS = ((12, 10), (14, 16))
#: chunk sizes that divide the rows' 60 tokens, do not, and hold them all
CHUNKS = (7, 20, 1000)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def tiny(family: str) -> Any:
    """A randomly initialised fp32 model: an untied Llama, a tied Qwen3, a Qwen3-MoE."""
    import transformers

    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config).float()
    if family == "qwen3":
        config = transformers.Qwen3Config(vocab_size=VOCAB, tie_word_embeddings=True, **TINY_QWEN3)
        model = transformers.Qwen3ForCausalLM(config).float()
        assert model.lm_head.weight is model.model.embed_tokens.weight
        return model
    config = transformers.Qwen3MoeConfig(vocab_size=VOCAB, **TINY_QWEN3, **TINY_EXPERTS)
    return transformers.Qwen3MoeForCausalLM(config).float()


def packed_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two packed rows of :data:`DOCUMENTS` as ``PackedRows`` gives them: positions
    restarting in each document, each document's first 4 targets (a prompt) and last
    target, and the padding, ignored; and the values DPO and GRPO read."""
    gen = torch.Generator().manual_seed(seed)
    rows, width = len(DOCUMENTS), max(len(d) for d in DOCUMENTS)
    batch = {
        "input_ids": torch.randint(0, VOCAB, (rows, SEQ), generator=gen),
        "position_ids": torch.zeros(rows, SEQ, dtype=torch.long),
        "labels": torch.randint(0, VOCAB, (rows, SEQ), generator=gen),
        "segments": torch.zeros(rows, SEQ, dtype=torch.long),
        "documents": torch.full((rows, width), -1, dtype=torch.long),
    }
    index = 0
    for row, lengths in enumerate(DOCUMENTS):
        start = 0
        for d, length in enumerate(lengths):
            span = slice(start, start + length)
            batch["position_ids"][row, span] = torch.arange(length)
            batch["segments"][row, span] = d + 1
            batch["labels"][row, start : start + 4] = IGNORE
            batch["labels"][row, start + length - 1] = IGNORE
            batch["documents"][row, d] = index
            start, index = start + length, index + 1
        batch["labels"][row, start:] = IGNORE
    batch["reference_logps"] = -20.0 - 5 * torch.rand(rows, width, generator=gen)
    batch["advantages"] = torch.randn(rows, width, generator=gen)
    batch["old_logps"] = -7.0 + torch.rand(rows, SEQ, generator=gen)
    batch["ref_logps"] = -7.0 + torch.rand(rows, SEQ, generator=gen)
    return batch


def step(model: Any, loss_fn: Any, batch: dict[str, Any]) -> dict[str, float]:
    """The loss, its gradient's 2-norm and the metrics of one backward."""
    model.zero_grad(set_to_none=True)
    out = loss_fn(model, batch)
    loss, metrics = out if isinstance(out, tuple) else (out, {})
    loss.backward()
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    result = {"loss": float(loss), "grad_norm": float(torch.cat(grads).norm())}
    for name, value in metrics.items():
        result[name] = float(value.value() if isinstance(value, WeightedMean) else value)
    return result


def assert_same(got: dict[str, float], want: dict[str, float]) -> None:
    """Loss and gradient norm within 1e-6; each metric too, or within 1e-5 where it is a
    difference of sums of log-probabilities (a margin of two -40s' float32 sums)."""
    assert got.keys() == want.keys()
    for name, value in want.items():
        near = 0.0 if name in ("loss", "grad_norm") else 1e-5
        assert got[name] == pytest.approx(value, rel=1e-6, abs=near), name


def with_items(run: ObjectiveRun, batch: dict[str, Any]) -> dict[str, Any]:
    """The batch as a training step sees it (its items the global batch's)."""
    return batch | {"num_items_in_batch": torch.tensor(float(ObjectiveItems(run)(batch)))}


def chunked(size: int) -> CrossEntropy:
    return CrossEntropy("chunked", chunk_size=size)


def losses(family: str, objective: str, path: CrossEntropy) -> Any:
    """The loss function the recipe builds for ``objective`` on ``family``."""
    grpo = {"temperature": 0.7, "reward": ("r",), "beta": 0.04}  # its entropy and kl too
    run = ObjectiveRun.of(objective, **(grpo if objective == "grpo" else {}))
    balance = None
    if family == "qwen3_moe":
        balance = RouterBalance(tiny(family).config, aux_loss_coef=0.01)
    if objective != "sft":
        return run, ObjectiveLoss(run, balance, path)
    if balance is not None:
        return run, MoECrossEntropyLoss(balance, path)
    return run, partial(cross_entropy_loss, cross_entropy=path)


@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("objective", ["sft", "dpo", "grpo"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_chunked_loss_and_gradient_equal_the_full_logits(family, objective, chunk_size):
    model = tiny(family)
    run, full = losses(family, objective, FULL)
    _, chunks = losses(family, objective, chunked(chunk_size))
    batch = with_items(run, packed_batch())
    want = step(model, full, batch)
    got = step(model, chunks, batch)
    assert_same(got, want)
    if family == "qwen3_moe":
        assert want["moe/aux_loss"] > 0.0
    if objective == "grpo":
        assert want["entropy"] > 0.0 and want["kl"] != 0.0
    # outside a training step (evaluation): the mean over the batch's own items
    with torch.no_grad():
        evaluated = [fn(model, packed_batch()) for fn in (full, chunks)]
    as_loss = [float(e[0] if isinstance(e, tuple) else e) for e in evaluated]
    assert as_loss[1] == pytest.approx(as_loss[0], rel=1e-6)


@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_chunked_logps_and_entropy_equal_the_full_logits(family, chunk_size):
    model = tiny(family)
    batch = packed_batch(seed=1)
    labels = batch["labels"]
    with torch.no_grad():
        logits = model(**model_inputs(batch)).logits
        _, logps, entropy = target_logps(
            model, model_inputs(batch), labels, chunked(chunk_size), temperature=0.7,
            entropy=True,
        )  # fmt: skip
    assert entropy is not None and logps.shape == labels.shape == entropy.shape
    torch.testing.assert_close(logps, token_logps(logits, labels, 0.7), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy, token_entropy(logits, 0.7), rtol=1e-6, atol=1e-6)
    assert not bool((logps[labels == IGNORE] != 0).any())
    # the head is the model's own again afterwards
    assert model(**model_inputs(batch)).logits.shape == (*labels.shape, VOCAB)


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("objective", ["sft", "grpo"])
def test_under_bf16_autocast_the_chunks_compute_as_the_head_does(objective, device):
    """Under autocast (``bf16-mixed``) the chunks project in bfloat16 as the autocast head
    does: on a CPU the loss within 2e-6 and the gradient norm within 5e-4 of the full
    logits' (projecting in float32 would move them by 1.4e-5 and 1.3e-3); on CUDA, whose
    kernels round each chunk's product on their own, within 1e-3."""
    model = tiny("qwen3").to(device)
    run, full = losses("qwen3", objective, FULL)
    _, chunks = losses("qwen3", objective, chunked(7))
    batch = {k: v.to(device) for k, v in with_items(run, packed_batch()).items()}
    with torch.autocast(device, dtype=torch.bfloat16):
        want, got = step(model, full, batch), step(model, chunks, batch)
    tolerance = {"loss": 2e-6, "grad_norm": 5e-4} if device == "cpu" else {}
    for name in ("loss", "grad_norm"):
        assert got[name] == pytest.approx(want[name], rel=tolerance.get(name, 1e-3)), name


def test_auto_chunks_on_cuda_keeps_the_full_logits_on_a_cpu_and_refuses_bad_choices():
    """``auto`` resolves per device (resolving needs no GPU): chunked on CUDA without
    Liger, the full logits on a CPU; a bad value, or a path that cannot run, is refused
    in one line."""
    config = tiny("llama").config
    on_cpu = resolve_cross_entropy("auto", config, device="cpu")
    assert (on_cpu.path, on_cpu.settings()) == ("full", {"cross_entropy_path": "full"})
    assert on_cpu.line() == "cross entropy: full (auto: not on cuda)"
    on_cuda = resolve_cross_entropy("auto", config, device="cuda")
    expected = (
        "fused (auto: liger_kernel on cuda)"
        if liger_installed()
        else "chunked (auto: liger_kernel is not installed)"
    )
    assert on_cuda.line() == f"cross entropy: {expected}"
    assert resolve_cross_entropy("chunked", config, device="cpu").path == "chunked"
    assert resolve_cross_entropy("full", config, device="cuda") == FULL
    with pytest.raises(UsageError, match="^--cross-entropy must be one of auto, chunked"):
        resolve_cross_entropy("fast", config, device="cpu")
    with pytest.raises(UsageError, match="fused needs liger_kernel and a CUDA device"):
        resolve_cross_entropy("fused", config, device="cpu")
    other = type(config)(**config.to_dict())
    other.model_type = "gpt2"
    fallback = resolve_cross_entropy("auto", other, device="cuda")
    assert fallback.line() == "cross entropy: full (auto: the head of gpt2 is not known)"
    with pytest.raises(UsageError, match="knows the heads of llama, qwen3, qwen3_moe, not gpt2"):
        resolve_cross_entropy("chunked", other, device="cpu")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("cross_entropy"), 96, num_rows=4)


def recipe_step(files: dict[str, Path], run_dir: Path, *args: str) -> dict[str, float]:
    argv = ["--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"])]
    argv += ["--max-steps", "1", "--log-every", "1", "--eval-every", "0", "--save-every", "0"]
    argv += ["--batch-size", "4", "--run-dir", str(run_dir), "--no-progress", *args]
    driver = build_driver(RECIPE, argv)
    record = LoggedMetrics()
    driver.callbacks.append(record)
    driver.fit()
    return record.metrics[1]


def recorded(run_dir: Path) -> dict[str, Any]:
    """The cross-entropy choice and path the run's settings record."""
    settings = json.loads((run_dir / "run.json").read_text())["settings"]
    return {k: settings[k] for k in ("cross_entropy", "cross_entropy_path")}


def first_rows(prefix: Path, batch_size: int) -> list[int]:
    """The rows the recipe's first step reads: the head of its seeded global order."""
    data = PackedDataset(prefix)
    train, _ = packed_loaders(data, batch_size=batch_size, seed=0, pad_id=0)
    return train.order(0)[:batch_size].tolist()


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_the_recipe_runs_each_path_with_the_same_first_step(files, tmp_path, objective):
    """Each path's first step equals the full logits' (1e-6) and the references outside
    baton on the chunked path too: ``transformers`` on each conversation alone (SFT),
    TRL's ``DPOTrainer`` (DPO)."""
    data = files["sft" if objective == "sft" else "pairs"]
    common = ["--objective", objective, "--data-path", str(data)]
    common += ["--reference", str(files["reference"])] if objective == "dpo" else []
    steps = {
        path: recipe_step(files, tmp_path / path, *common, "--cross-entropy", path)
        for path in ("full", "chunked", "auto")
    }
    for path in ("chunked", "auto"):
        for name in ("loss", "grad_norm"):
            assert steps[path][name] == pytest.approx(steps["full"][name], rel=1e-6), name
    assert recorded(tmp_path / "auto") == {"cross_entropy": "auto", "cross_entropy_path": "full"}
    assert recorded(tmp_path / "chunked")["cross_entropy_path"] == "chunked"
    rows = first_rows(data, 4)
    if objective == "sft":
        loss, grad_norm = sft_reference(files["policy"], data, rows)
        assert steps["chunked"]["loss"] == pytest.approx(loss, rel=1e-5)
        assert steps["chunked"]["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    else:
        trl = dpo_reference(files["policy"], files["reference"], data, rows)
        assert steps["chunked"]["loss"] == pytest.approx(trl["loss"], rel=1e-5)
        for name in ("logps/chosen", "logps/rejected"):
            assert steps["chunked"][name] == pytest.approx(trl[name], rel=1e-5), name


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_chunked_grpo_steps_equal_trl(grpo_assets, tmp_path, beta):
    """GRPO on the fixed rollouts with the chunked log-probabilities and entropy (at the
    sampling temperature): the first step's loss, gradient norm and TRL's metrics equal
    TRL's ``GRPOTrainer`` (1e-5, as the full path's test has them)."""
    flags = [
        *grpo_flags(grpo_assets["files"], max_prompt_length=24, beta=beta),
        "--seq-len", "40", "--batch-size", "16", "--lr", "1e-3", "--grad-clip", "1.0",
        "--max-steps", "1", "--log-every", "1", "--save-every", "0", "--no-progress",
        "--run-dir", str(tmp_path / "run"), "--cross-entropy", "chunked",
    ]  # fmt: skip
    driver = build_driver(RECIPE, flags)
    record = LoggedMetrics()
    driver.callbacks.append(record)
    driver.fit()
    got = record.metrics[1]
    trl = grpo_assets["reference"](beta=beta, steps=1)[0]
    assert got["loss"] == pytest.approx(trl["loss"], rel=1e-5, abs=1e-6)
    assert got["grad_norm"] == pytest.approx(trl["grad_norm"], rel=1e-5)
    names = ("entropy", "clip_ratio/region_mean", *(("kl",) if beta else ()))
    for name in names:
        assert got[name] == pytest.approx(trl[name], rel=1e-5, abs=1e-7), name


def test_the_recipe_refuses_a_bad_choice(files, tmp_path):
    with pytest.raises(UsageError, match="--cross-entropy must be one of"):
        recipe_step(files, tmp_path / "bad", "--cross-entropy", "fast")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_pretraining_chunks_its_loss_as_the_model_does(tmp_path, family):
    """Byte pretraining (the model's own loss over every next byte; a MoE's with its
    load-balancing term) on both paths."""
    model_dir = tmp_path / "tiny"
    if family == "qwen3_moe":
        save_tiny_qwen3(model_dir, moe=True)
    args = ["--init-from", str(model_dir), "--make-tiny-model", "--max-steps", "1"]
    args += ["--log-every", "1", "--eval-every", "0", "--save-every", "0", "--no-progress"]
    args += ["--batch-size", "2", "--seq-len", "32"]
    got = {}
    for path in ("full", "chunked"):
        run_dir = ["--run-dir", str(tmp_path / path), "--cross-entropy", path]
        driver = build_driver(RECIPE, [*args, *run_dir])
        record = LoggedMetrics()
        driver.callbacks.append(record)
        driver.fit()
        got[path] = record.metrics[1]
    names = ("loss", "grad_norm", *(("moe/aux_loss",) if family == "qwen3_moe" else ()))
    for name in names:
        assert got["chunked"][name] == pytest.approx(got["full"][name], rel=1e-6), name


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp2", "fsdp1"])
def test_the_chunked_head_runs_inside_a_sharded_model(tmp_path, mode):
    """A tied Llama sharded over 2 CPU ranks as Fabric's sharded strategies hold it: the
    chunked SFT step equals the full one and the unsharded model's. (Fabric's own
    ``fsdp`` strategy needs GPUs.)"""
    from support.tiny_llama import save_tiny_llama
    from support.torchrun import torchrun

    source = save_tiny_llama(tmp_path / "llama", tie=True)
    out = tmp_path / "out"
    torchrun(Path(__file__).parent / "chunked_sharded_worker.py", mode, str(source), str(out))
    got = json.loads(Path(f"{out}.json").read_text())
    for path in ("full", "chunked"):
        for name in ("loss", "grad_norm"):
            assert got[path][name] == pytest.approx(got["unsharded"][name], rel=1e-6), path
