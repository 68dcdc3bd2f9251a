"""The Fabric backend's fast paths (``fabric/fast_paths.py``; recipes/hf_finetune.py's
--attention, --compile-layers, --fused-optimizer): how ``auto`` resolves per device and
data, bad values refused in one line, and each path against the plain one in fp32 on
CPU: flex_attention's block mask keeps the packed documents' mask and gives sdpa's loss
(forward: torch's FlexAttention has no backward on CPU), compiled decoder layers and the
fused AdamW give the plain run's losses and gradient norms over steps, and a run with
the paths forced saves checkpoints without ``_orig_mod`` keys and resumes onto the
plain run's step."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from baton.backends.fabric.cross_entropy import CrossEntropy
from baton.backends.fabric.fast_paths import (
    FastPaths,
    compile_decoder_layers,
    decoder_layers,
    supports_flex,
)
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from support.posttrain import LoggedMetrics, posttrain_files
from support.tiny_llama import save_tiny_llama

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


# -- resolution ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("device", "packed", "expected"),
    [
        ("cuda", True, FastPaths("flex", compiled_layers=True, fused_optimizer=True)),
        ("cuda", False, FastPaths("sdpa", compiled_layers=True, fused_optimizer=True)),
        ("cpu", True, FastPaths("sdpa", compiled_layers=False, fused_optimizer=False)),
        ("cpu", False, FastPaths("sdpa", compiled_layers=False, fused_optimizer=False)),
    ],
)
def test_auto_is_the_fast_path_on_a_gpu_and_the_plain_one_on_a_cpu(device, packed, expected):
    assert FastPaths.resolve(device=device, packed=packed) == expected


def test_forced_paths_and_a_model_without_flex():
    forced = FastPaths.resolve(
        attention="eager", compile_layers="on", fused_optimizer="on", device="cpu", packed=True
    )
    assert forced == FastPaths("eager", compiled_layers=True, fused_optimizer=True)
    off = FastPaths.resolve(compile_layers="off", fused_optimizer="off", device="cuda", packed=True)
    assert not off.compiled_layers and not off.fused_optimizer
    assert FastPaths.resolve(attention="flex", device="cuda", packed=False).attention == "flex"
    # auto falls back to sdpa where the model has no flex_attention; forced flex is refused
    assert FastPaths.resolve(device="cuda", packed=True, flex_supported=False).attention == "sdpa"
    with pytest.raises(UsageError, match="--attention flex"):
        FastPaths.resolve(attention="flex", device="cuda", packed=True, flex_supported=False)
    assert FastPaths("flex").attn_implementation == "flex_attention"
    assert FastPaths(fused_optimizer=True).optimizer_options() == {"fused": True}
    assert FastPaths().optimizer_options() == {}


@pytest.mark.parametrize(
    ("flag", "value", "choices"),
    [
        ("attention", "flash", "auto, sdpa, flex, eager"),
        ("compile-layers", "yes", "auto, on, off"),
        ("fused-optimizer", "true", "auto, on, off"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag_and_the_choices(flag, value, choices):
    with pytest.raises(UsageError) as error:
        FastPaths.resolve(**{flag.replace("-", "_"): value}, device="cpu", packed=True)
    assert str(error.value) == f"--{flag} must be one of {choices}, got {value!r}"


def test_flex_is_refused_for_training_on_a_cpu():
    with pytest.raises(UsageError, match="no backward pass on a CPU"):
        FastPaths.resolve(attention="flex", device="cpu", packed=True)


def test_the_one_line_says_which_paths_run():
    line = FastPaths("flex", compiled_layers=True, fused_optimizer=True).describe()
    assert line == (
        "fast paths: attention flex (flex_attention, block mask of the rows' documents), "
        "decoder layers compiled, fused AdamW, cross entropy full"
    )
    assert FastPaths().describe() == (
        "fast paths: attention sdpa, decoder layers eager, AdamW unfused, cross entropy full"
    )
    chunked = FastPaths(
        cross_entropy=CrossEntropy("chunked", "auto: liger_kernel is not installed")
    )
    assert chunked.describe().endswith(
        ", cross entropy chunked (auto: liger_kernel is not installed)"
    )
    assert FastPaths().settings() == {
        "fast_paths": {
            "attention": "sdpa", "compiled_layers": False, "fused_optimizer": False,
            "cross_entropy": "full",
        }
    }  # fmt: skip


# -- attention -------------------------------------------------------------------------
def packed_batch(vocab: int) -> dict[str, Any]:
    """Two rows: three documents (10, 8, 6 tokens), and one of 20 with 4 of padding
    (positions 0, as ``PackedDataset`` pads)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 24), generator=generator)
    positions = torch.tensor(
        [[*range(10), *range(8), *range(6)], [*range(20), 0, 0, 0, 0]], dtype=torch.long
    )
    return {"input_ids": ids, "position_ids": positions, "labels": ids, "use_cache": False}


def test_flex_attention_keeps_the_documents_mask_as_a_block_mask(tmp_path):
    """With flex_attention, transformers turns the packed rows' block-causal mask into a
    BlockMask (not a dense tensor): element for element the mask sdpa is given."""
    from torch.nn.attention.flex_attention import BlockMask, create_mask
    from transformers import AutoConfig
    from transformers.masking_utils import create_causal_mask

    config = AutoConfig.from_pretrained(save_tiny_llama(tmp_path / "hf"))
    assert supports_flex(config)
    batch = packed_batch(config.vocab_size)
    embeds = torch.zeros(2, 24, config.hidden_size)
    masks = {}
    for implementation in ("sdpa", "flex_attention"):
        config._attn_implementation = implementation
        masks[implementation] = create_causal_mask(
            config=config, inputs_embeds=embeds, attention_mask=None,
            past_key_values=None, position_ids=batch["position_ids"],
        )  # fmt: skip
    dense, block = masks["sdpa"], masks["flex_attention"]
    assert isinstance(dense, torch.Tensor) and isinstance(block, BlockMask)
    assert torch.equal(create_mask(block.mask_mod, 2, None, 24, 24, device="cpu"), dense)
    # documents stay apart: the first row's third document sees none of the first two
    assert not dense[0, 0, 18, :18].any() and dense[0, 0, 18, 18]


def test_flex_attention_gives_sdpa_loss_on_packed_rows(tmp_path):
    """fp32 on CPU, forward only (torch's FlexAttention has no backward on CPU; the GPU
    benchmark compares the training step)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = save_tiny_llama(tmp_path / "hf")
    config = AutoConfig.from_pretrained(hf)
    plain = AutoModelForCausalLM.from_pretrained(hf, attn_implementation="sdpa")
    flex = AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation=FastPaths("flex").attn_implementation
    )
    flex.load_state_dict(plain.state_dict())
    assert config._attn_implementation != "flex_attention"  # the copy took it, not config
    batch = packed_batch(config.vocab_size)
    with torch.no_grad():
        want, got = plain(**batch), flex(**batch)
    assert abs(got.loss.item() - want.loss.item()) < 1e-6
    assert (got.logits - want.logits).abs().max().item() < 1e-5


def test_baton_builds_the_same_block_mask_without_asking_the_device(tmp_path):
    """``document_mask.py``: the documents' BlockMask baton hands a flex model equals
    transformers' element for element, gives the same loss, and the forward pass
    brings nothing to the host (transformers' own detection asks ``bool(tensor)``)."""
    from torch.nn.attention.flex_attention import BlockMask, create_mask
    from torch.overrides import TorchFunctionMode
    from transformers import AutoModelForCausalLM
    from transformers.masking_utils import create_causal_mask

    from baton.backends.fabric.document_mask import document_block_mask

    class Materialised(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("item", "__bool__", "__float__", "cpu"):
                self.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    hf = save_tiny_llama(tmp_path / "hf")
    plain = AutoModelForCausalLM.from_pretrained(hf, attn_implementation="sdpa")
    flex = AutoModelForCausalLM.from_pretrained(hf, attn_implementation="flex_attention")
    batch = packed_batch(plain.config.vocab_size)
    ours = document_block_mask(batch["position_ids"])
    embeds = torch.zeros(2, 24, plain.config.hidden_size)
    theirs = create_causal_mask(
        config=flex.config, inputs_embeds=embeds, attention_mask=None,
        past_key_values=None, position_ids=batch["position_ids"],
    )  # fmt: skip
    assert isinstance(theirs, BlockMask)
    dense = [create_mask(m.mask_mod, 2, None, 24, 24, device="cpu") for m in (ours, theirs)]
    assert torch.equal(*dense)

    FastPaths("flex").prepare(flex)  # installs the documents' mask
    with torch.no_grad():
        want = plain(**batch)
        flex(**batch)  # compiled on the first call
        plain_seen, flex_seen = Materialised(), Materialised()
        with plain_seen:
            plain(**batch)
        with flex_seen:
            got = flex(**batch)
    assert abs(got.loss.item() - want.loss.item()) < 1e-6
    assert plain_seen.seen == ["__bool__"] and flex_seen.seen == []


def test_the_documents_mask_is_left_to_transformers_where_it_does_not_fit(tmp_path):
    """Only calls transformers reads packed documents from, and only full attention."""
    from transformers import AutoModelForCausalLM

    from baton.backends.fabric.document_mask import DocumentBlockMask, use_document_block_mask

    hook = DocumentBlockMask()
    model = torch.nn.Linear(2, 2)
    batch = packed_batch(16)
    assert hook(model, (), {**batch, "use_cache": None}) is None  # a cache may be made
    assert hook(model, (), {**batch, "attention_mask": torch.ones(2, 24)}) is None
    assert hook(model, (), {"input_ids": batch["input_ids"], "use_cache": False}) is None
    _, given = hook(model, (), batch) or ((), {})
    assert type(given["attention_mask"]).__name__ == "BlockMask"
    from support.tiny_qwen3 import save_tiny_qwen3

    kinds = ["full_attention", "sliding_attention"]
    sliding = save_tiny_qwen3(
        tmp_path / "qwen3", use_sliding_window=True, sliding_window=8, layer_types=kinds
    )
    assert not use_document_block_mask(AutoModelForCausalLM.from_pretrained(sliding))
    full = AutoModelForCausalLM.from_pretrained(save_tiny_qwen3(tmp_path / "full"))
    assert use_document_block_mask(full)


# -- compiled layers and the fused optimizer ------------------------------------------
def train_steps(
    hf: Path, paths: FastPaths, steps: int = 2
) -> tuple[list[tuple[float, float]], dict[str, torch.Tensor]]:
    """``steps`` plain training steps of the model in ``hf`` on packed rows with
    ``paths``: each step's (loss, gradient norm), and the final weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, attn_implementation=paths.attn_implementation)
    model.train()
    paths.prepare(model)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-2, weight_decay=0.0, **paths.optimizer_options()
    )
    batch = packed_batch(model.config.vocab_size)
    seen = []
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seen.append((loss.item(), norm.item()))
    return seen, model.state_dict()


def test_compiled_decoder_layers_equal_eager_and_keep_their_names(tmp_path):
    hf = save_tiny_llama(tmp_path / "hf", num_hidden_layers=1)
    plain, plain_state = train_steps(hf, FastPaths())
    compiled, compiled_state = train_steps(hf, FastPaths(compiled_layers=True))
    for (loss, norm), (want_loss, want_norm) in zip(compiled, plain, strict=True):
        assert abs(loss - want_loss) < 1e-6 and abs(norm - want_norm) < 1e-6
    assert list(compiled_state) == list(plain_state)  # no _orig_mod in any key


def test_only_the_decoder_layers_are_compiled(tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(save_tiny_llama(tmp_path / "hf"))
    assert compile_decoder_layers(model) == 2
    assert all(getattr(layer, "_compiled_call_impl", None) for layer in decoder_layers(model))
    assert getattr(model, "_compiled_call_impl", None) is None
    with pytest.raises(UsageError, match="--compile-layers"):
        compile_decoder_layers(torch.nn.Linear(2, 2))


def test_fused_adamw_equals_the_plain_one_on_cpu(tmp_path):
    """torch's CPU fused AdamW against its default (foreach) within 1e-6 in fp32: what
    a forced --fused-optimizer on gives on a CPU (its auto stays off there)."""
    hf = save_tiny_llama(tmp_path / "hf")
    plain, plain_state = train_steps(hf, FastPaths(), steps=3)
    fused, fused_state = train_steps(hf, FastPaths(fused_optimizer=True), steps=3)
    for (loss, norm), (want_loss, want_norm) in zip(fused, plain, strict=True):
        assert abs(loss - want_loss) < 1e-6 and abs(norm - want_norm) < 1e-6
    for name, value in plain_state.items():
        assert (fused_state[name] - value).abs().max().item() < 1e-6, name


# -- the recipe ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("fast"), 48, num_rows=8, kinds=("sft",))


class Lines(logging.Handler):
    """The ``baton`` logger's lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def recipe_run(files: dict[str, Path], run_dir: Path, *args: str) -> tuple[LoggedMetrics, Any]:
    argv = ["--objective", "sft", "--data-path", str(files["sft"]), "--init-from",
            str(files["policy"]), "--tokenizer", str(files["tokenizer"]), "--batch-size", "2",
            "--log-every", "1", "--eval-every", "0", "--save-every", "2", "--no-progress",
            "--run-dir", str(run_dir), *args]  # fmt: skip
    driver = build_driver(RECIPE, argv)
    assert driver is not None
    record = LoggedMetrics()
    driver.callbacks.append(record)
    lines, logger = Lines(), logging.getLogger("baton")
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        driver.fit()
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    return record, lines.lines


def test_a_run_with_the_paths_forced_on_cpu_equals_the_plain_run_and_resumes(files, tmp_path):
    """SFT with eager attention, compiled layers and the fused AdamW: the plain run's
    loss and gradient norm at each step, checkpoints without ``_orig_mod``, and a resume
    from step 2 onto the plain run's step 3; the paths are logged once and recorded."""
    import json

    from support.states import load_state

    plain, plain_lines = recipe_run(files, tmp_path / "plain", "--max-steps", "3")
    forced = ["--attention", "eager", "--compile-layers", "on", "--fused-optimizer", "on"]
    fast, fast_lines = recipe_run(files, tmp_path / "fast", "--max-steps", "2", *forced)
    resumed, _ = recipe_run(
        files, tmp_path / "fast", "--max-steps", "3", "--resume", "auto",
        "--allow-changed", "max_steps", *forced,
    )  # fmt: skip
    got = {**fast.metrics, **resumed.metrics}
    assert sorted(got) == [1, 2, 3]
    for step in (1, 2, 3):
        for name in ("loss", "grad_norm"):
            assert abs(got[step][name] - plain.metrics[step][name]) < 1e-6, (step, name)

    assert [line for line in plain_lines if line.startswith("fast paths:")] == [
        "fast paths: attention sdpa, decoder layers eager, AdamW unfused, "
        "cross entropy full (auto: not on cuda)"
    ]
    assert [line for line in fast_lines if line.startswith("fast paths:")] == [
        "fast paths: attention eager, decoder layers compiled, fused AdamW, "
        "cross entropy full (auto: not on cuda)"
    ]
    checkpoint = tmp_path / "fast" / "checkpoints" / "step_000002"
    state = load_state(checkpoint)
    assert not [key for key in state["model"] if "_orig_mod" in key]
    assert set(state["model"]) == set(
        load_state(tmp_path / "plain" / "checkpoints" / "step_000002")["model"]
    )
    meta = json.loads((checkpoint / "baton.json").read_text())
    assert meta["settings"]["fast_paths"] == {
        "attention": "eager", "compiled_layers": True, "fused_optimizer": True,
        "cross_entropy": "full",
    }  # fmt: skip


def test_the_cli_refuses_a_bad_path_in_one_line_before_writing(files, tmp_path, capsys):
    from baton.core.cli.command import main as baton

    tiny = tmp_path / "tiny"
    argv = ["run", str(RECIPE), "--init-from", str(tiny), "--make-tiny-model"]
    argv += ["--compile-layers", "always", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    assert baton(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "--compile-layers must be one of auto, on, off, got 'always'" in err[0]
    assert not (tmp_path / "run").exists() and not tiny.exists()


@pytest.mark.slow
def test_compiled_layers_under_two_ddp_ranks_equal_transformers(files, tmp_path):
    """Under torchrun (2 ranks, gloo) the layers are compiled before Fabric wraps the
    model in DDP (Lightning's FSDP runs on GPUs only): the first step equals
    transformers on the step's rows."""
    import json

    from baton.backends.fabric.hf_posttrain import packed_loaders
    from baton.data.packed import PackedDataset
    from support.posttrain import sft_reference
    from support.torchrun import torchrun

    cli = ROOT / "packages" / "core" / "src" / "baton" / "core" / "cli" / "command.py"
    torchrun(
        cli, "run", str(RECIPE), "--objective", "sft", "--data-path", str(files["sft"]),
        "--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"]),
        "--strategy", "ddp", "--compile-layers", "on", "--fused-optimizer", "on",
        "--batch-size", "2", "--max-steps", "1", "--log-every", "1", "--eval-every", "0",
        "--save-every", "1", "--no-progress", "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    logged = [json.loads(line) for line in (tmp_path / "run" / "logs" / "metrics.jsonl").open()]
    got = next(row for row in logged if row.get("step") == 1 and "loss" in row)
    train, _ = packed_loaders(PackedDataset(files["sft"]), batch_size=2, seed=0, pad_id=0)
    loss, grad_norm = sft_reference(files["policy"], files["sft"], train.order(0)[:4].tolist())
    assert got["loss"] == pytest.approx(loss, rel=1e-5)
    assert got["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
