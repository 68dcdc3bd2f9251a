"""``baton generate``: what it prints is what ``transformers``' own ``generate`` gives
(greedy), from a Hugging Face directory (plain and through the chat template) and from
a real checkpoint of the hf_finetune recipe; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.core.cli.command import main as baton
from baton.core.cli.recipe import build_driver
from baton.data import TokenizerInfo

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "hf_finetune.py"
PROMPT = "def main(args):"
#: a one-turn template of the kind chat models ship (user turn, then the assistant's)
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def generated(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert baton(["generate", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.removesuffix("\n")


def reference(directory: Path, ids: list[int], new_tokens: int) -> list[int]:
    """The ids ``transformers``' greedy ``generate`` adds to ``ids``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    inputs = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=new_tokens,
            do_sample=False,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: TokenizerInfo) -> Path:
    """A tiny random Llama over the trained tokenizer, with a chat template, saved as
    ``save_pretrained`` writes a model directory."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("generate") / "tiny"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tok = AutoTokenizer.from_pretrained(tokenizer.path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(directory)
    return directory


def test_a_hugging_face_directory_greedy_and_chat(hf_dir: Path, capsys) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    ids = tok(PROMPT)["input_ids"]
    want = tok.decode(reference(hf_dir, ids, 12), skip_special_tokens=True)
    assert want  # a random model still says something
    assert generated(capsys, str(hf_dir), "--prompt", PROMPT, "--max-new-tokens", "12") == want

    text = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    assert text == f"<|user|>{PROMPT}\n<|assistant|>"
    chat_ids = tok(text, add_special_tokens=False)["input_ids"]
    want_chat = tok.decode(reference(hf_dir, chat_ids, 12), skip_special_tokens=True)
    got = generated(capsys, str(hf_dir), "--prompt", PROMPT, "--max-new-tokens", "12", "--chat")
    assert got == want_chat


def test_a_checkpoint_of_the_hf_finetune_recipe(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    args = ["--init-from", str(tmp_path / "tiny-llama"), "--make-tiny-model"]
    args += ["--max-steps", "2", "--save-every", "2", "--run-dir", str(run)]
    build_driver(RECIPE, args).fit()
    exported = tmp_path / "exported"
    checkpoint = run / "checkpoints" / "step_000002"
    assert baton(["export", str(checkpoint), "--format", "hf", str(exported)]) == 0
    # a byte-level run: UTF-8 bytes in and out
    want = bytes(reference(exported, list(PROMPT.encode()), 6)).decode(errors="replace")
    assert generated(capsys, str(checkpoint), "--prompt", PROMPT, "--max-new-tokens", "6") == want
    # the run directory stands for its latest checkpoint
    assert generated(capsys, str(run), "--prompt", PROMPT, "--max-new-tokens", "6") == want
    # a run fine-tuned on conversations takes the chat template by itself (a byte-level
    # model has none: refused, naming the reason)
    meta_file = checkpoint / "baton.json"
    meta = json.loads(meta_file.read_text())
    meta["settings"]["objective"] = "sft"
    meta_file.write_text(json.dumps(meta))
    capsys.readouterr()
    assert baton(["generate", str(checkpoint), "--prompt", PROMPT]) == 2
    assert "objective 'sft' (conversations) asks for a chat template" in capsys.readouterr().err


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, hf_dir: Path, capsys) -> None:
    bare = tmp_path / "bare"  # a model directory without a tokenizer, not byte-level
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"vocab_size": 512, "model_type": "llama"}))
    cases = {
        str(tmp_path / "missing"): "does not exist",
        str(tmp_path): "neither a baton checkpoint",
        str(bare): "has no tokenizer",
    }
    for source, message in cases.items():
        capsys.readouterr()
        assert baton(["generate", source, "--prompt", "x"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert baton(["generate", str(hf_dir), "--prompt", "x", "--tokenizer", str(bare)]) == 2
    assert "holds no tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("objective", "chat"),
    [("sft", True), ("dpo", True), ("pretrain", False), ("grpo", False), ("unknown", False)],
)
def test_the_chat_template_follows_the_data_the_run_s_objective_declares(
    objective: str, chat: bool, tmp_path: Path
) -> None:
    """A run trained on conversations or preference pairs is prompted through the chat
    template; one on text or on prompts (rendered as prepared, text or turns) is not
    unless ``--chat`` says so, and an objective this process does not know neither."""
    from baton.tools.generate import Model

    model = Model(tmp_path, {"objective": objective})
    assert (model.chat_reason is not None) is chat
