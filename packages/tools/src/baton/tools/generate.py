"""``baton generate``: a few tokens sampled from a checkpoint of any engine, to look at
what a run learned without writing code.

baton generate CKPT_OR_HF_DIR --prompt TEXT [--max-new-tokens N] [--chat]
               [--temperature T] [--seed S] [--tokenizer DIR]

A baton checkpoint (``runs/x/checkpoints/step_000050``, ``.../latest``, or the run
directory itself for its latest) is exported to Hugging Face format in a temporary
directory (``baton export --format hf``: Fabric, TorchTitan, Megatron-Core, MaxText); a
Hugging Face directory (``config.json`` and weights) is used as it is. The model runs
through ``transformers``' own ``generate``: greedy unless ``--temperature`` is above 0
(then sampled, seeded by ``--seed``). Only the continuation is printed, with special
tokens left out.

The tokenizer is the directory's own (a checkpoint's: its run's ``tokenizer``),
``--tokenizer`` overrides it; a model of 256 ids with none reads UTF-8 bytes, as baton's
byte-level runs do. The prompt goes through the tokenizer's chat template (one user
turn, then the assistant's turn) with ``--chat``, or when the checkpoint's run was
fine-tuned on conversations (its recorded ``objective`` is ``sft`` or ``dpo``).

Example::

    uv run baton run recipes/hf_finetune.py --init-from tiny-llama --make-tiny-model
    uv run baton generate runs/hf_finetune --prompt "def main(" --max-new-tokens 20
    uv run baton generate exported/ --prompt "Hello" --chat --temperature 0.7 --seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.core.checkpoints.files import (
    LATEST,
    META_FILE,
    CheckpointError,
    checkpoints_dir,
    read_meta,
)
from baton.core.errors import UsageError
from baton.core.objectives import OBJECTIVES, DataKind

#: the kinds of data whose prompts are conversations: a run trained on them is prompted
#: through the chat template
CHAT_DATA = frozenset({DataKind.CONVERSATIONS, DataKind.PAIRS})
#: files that make a directory a tokenizer ``transformers.AutoTokenizer`` loads
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
#: the vocabulary of baton's byte-level runs (no tokenizer)
BYTE_VOCAB = 256


@dataclass(frozen=True)
class Model:
    """A Hugging Face model directory and what the run it came from recorded."""

    directory: Path
    settings: dict[str, Any]

    @property
    def chat_reason(self) -> str | None:
        """Why prompts take the chat template (the run was fine-tuned on conversations),
        or ``None``."""
        objective = self.settings.get("objective")
        if not isinstance(objective, str) or objective not in OBJECTIVES:
            return None  # pretraining, or an objective this process does not know
        if OBJECTIVES.get(objective).data in CHAT_DATA:
            return f"the run's objective {objective!r} (conversations)"
        return None


def checkpoint_of(source: Path) -> Path | None:
    """The baton checkpoint ``source`` names (itself, or a run directory's latest)."""
    if (source / META_FILE).is_file():
        return source
    latest = checkpoints_dir(source) / LATEST
    if (latest / META_FILE).is_file():
        return latest.resolve()
    return None


@contextlib.contextmanager
def hugging_face_model(source: Path) -> Iterator[Model]:
    """The Hugging Face directory of ``source``: itself, or a checkpoint's export in a
    temporary directory removed afterwards. Raises ``UsageError`` for anything else."""
    if not source.is_dir():
        raise UsageError(f"{source} does not exist: give a checkpoint or a Hugging Face directory")
    if (source / "config.json").is_file():
        yield Model(source, {})
        return
    checkpoint = checkpoint_of(source)
    if checkpoint is None:
        raise UsageError(
            f"{source} is neither a baton checkpoint (baton.json) nor a Hugging Face model "
            "directory (config.json): give runs/NAME/checkpoints/step_N or a save_pretrained "
            "directory"
        )
    from baton.tools.export import export_hf

    # sizes only here: the export reads and checks every byte
    settings: dict[str, Any] = read_meta(checkpoint, verify="size").get("settings") or {}
    with tempfile.TemporaryDirectory(prefix="baton-generate-") as scratch:
        yield Model(export_hf(checkpoint, Path(scratch) / "hf"), settings)


class ByteTokenizer:
    """UTF-8 bytes as token ids, for models of baton's byte-level runs."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def load_tokenizer(model: Model, override: Path | None) -> Any:
    """The tokenizer for ``model``: ``override``, the directory's own, or UTF-8 bytes for
    a 256-id model without one. Raises ``UsageError`` when there is none."""
    import json

    directory = override or model.directory
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(directory)
    if override is not None:
        raise UsageError(
            f"--tokenizer {override} holds no tokenizer ({', '.join(TOKENIZER_FILES)})"
        )
    config = json.loads((model.directory / "config.json").read_text())
    if config.get("vocab_size") == BYTE_VOCAB:
        return ByteTokenizer()
    raise UsageError(
        f"{model.directory} has no tokenizer and its model is not byte-level: "
        "pass --tokenizer DIR (the tokenizer the model was trained with)"
    )


def prompt_ids(tokenizer: Any, prompt: str, chat: str | None) -> list[int]:
    """The prompt's token ids, through the chat template when ``chat`` says why
    (``"--chat"``, or the run's objective)."""
    if chat is not None and (
        isinstance(tokenizer, ByteTokenizer) or not getattr(tokenizer, "chat_template", None)
    ):
        fix = "leave out --chat" if chat == "--chat" else "pass --tokenizer DIR with one"
        raise UsageError(f"{chat} asks for a chat template and the tokenizer has none: {fix}")
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode(prompt)
    if chat is not None:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def generate(
    model: Model,
    prompt: str,
    *,
    max_new_tokens: int = 32,
    chat: bool = False,
    temperature: float = 0.0,
    seed: int = 0,
    tokenizer_dir: Path | None = None,
) -> str:
    """The continuation ``transformers``' ``generate`` gives ``prompt`` (greedy when
    ``temperature`` is 0), decoded without special tokens."""
    tokenizer = load_tokenizer(model, tokenizer_dir)
    why = "--chat" if chat else model.chat_reason
    ids = prompt_ids(tokenizer, prompt, why)
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    network: Any = AutoModelForCausalLM.from_pretrained(model.directory)
    network.eval()
    inputs = torch.tensor([ids])
    sampling: dict[str, Any] = {"do_sample": temperature > 0}
    if temperature > 0:
        sampling.update(temperature=temperature, top_k=0, top_p=1.0)
    with torch.no_grad():
        output = network.generate(
            input_ids=inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=max_new_tokens,
            **sampling,
        )
    new = output[0, inputs.shape[1] :].tolist()
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.decode(new)
    return str(tokenizer.decode(new, skip_special_tokens=True))


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="baton generate", description="Sample a few tokens from a checkpoint or model."
    )
    parser.add_argument("source", type=Path, help="a checkpoint, a run directory or an HF dir")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate")
    parser.add_argument("--chat", action="store_true", help="use the tokenizer's chat template")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer directory to use instead")
    args = parser.parse_args(list(argv))
    try:
        if args.max_new_tokens < 1 or args.temperature < 0:
            raise UsageError("--max-new-tokens must be >= 1 and --temperature >= 0")
        with hugging_face_model(args.source) as model:
            text = generate(
                model,
                args.prompt,
                max_new_tokens=args.max_new_tokens,
                chat=args.chat,
                temperature=args.temperature,
                seed=args.seed,
                tokenizer_dir=args.tokenizer,
            )
    except (UsageError, CheckpointError) as error:
        print(f"baton generate: {error}", file=sys.stderr)
        return 2
    print(text)
    return 0
