"""An exported Hugging Face directory carries the run tokenizer's files, its chat template
included, so ``transformers`` renders conversations for the fine-tuned model as it did for
the model it started from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from baton.backends.hf_io import write_model
from support.posttrain import chat_tokenizer


def test_an_export_keeps_the_tokenizers_chat_template(tmp_path: Path) -> None:
    tokenizer = chat_tokenizer(tmp_path / "tok")
    out = write_model(
        tmp_path / "export",
        {"lm_head.weight": np.zeros((4, 2), dtype=np.float32)},
        {"model_type": "llama"},
        tokenizer=tokenizer,
    )
    messages = [{"role": "user", "content": "why do cats sleep"}]
    original = AutoTokenizer.from_pretrained(tokenizer)
    exported = AutoTokenizer.from_pretrained(out)
    assert exported.chat_template == original.chat_template is not None
    rendered = exported.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nwhy do cats sleep<|im_end|>\n<|im_start|>assistant\n"
