"""``baton data inspect`` on post-training data speaks of what it is for: rows,
conversations or pairs, supervised tokens and fill, and ``-n K`` shows K conversations
or pairs decoded with their supervised tokens in ``[[...]]`` (also green on a terminal),
as a user runs it after ``baton data prepare --seq-len N``."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from baton.data import load_tokenizer
from baton.data.packed import PackedDataset
from baton.tools.data.cli import main
from support.posttrain import chat_tokenizer, conversations, preference_pairs

SEQ = 96
MARKED = re.compile(r"\[\[(.*?)\]\]", re.S)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inspect")
    tokenizer = chat_tokenizer(root / "tok")
    (root / "chat.jsonl").write_text(
        "".join(json.dumps({"messages": m}) + "\n" for m in conversations(12))
    )
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preference_pairs(6)))
    for name in ("chat", "pairs"):
        argv = [str(root / f"{name}.jsonl"), "--tokenizer", str(tokenizer),
                "--seq-len", str(SEQ), "--output", str(root / name)]  # fmt: skip
        assert main(["prepare", *argv]) == 0
    return {"tokenizer": tokenizer, "chat": root / "chat", "pairs": root / "pairs"}


def supervised_runs(tokens, mask, tokenizer) -> list[str]:
    """The decoded runs of consecutive supervised tokens of one document."""
    runs, current = [], []
    for token, flag in zip(tokens.tolist(), mask.tolist(), strict=True):
        if flag:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.tokenizer.decode(run, skip_special_tokens=False) for run in runs]


def test_conversations_in_rows_with_their_supervised_tokens_marked(prepared, capsys):
    assert main(["inspect", str(prepared["chat"]), "-n", "2", "--chars", "100000"]) == 0
    out = capsys.readouterr().out
    data = PackedDataset(prepared["chat"])
    manifest = data.manifest
    assert "documents" not in out and "sequences" not in out  # Megatron's words, not the user's
    assert re.search(r"^conversations +12 \(from 12 records\)$", out, re.M), out
    rows = f"{data.num_rows} packed rows of {SEQ + 1} tokens (--seq-len {SEQ}), fill "
    assert f"{rows}{manifest['packing']['fill']:.1%}" in out
    supervised = manifest["supervised_tokens"]
    share = supervised / manifest["tokens"]
    assert f"supervised tokens  {supervised} ({share:.1%}: the tokens the loss is on)" in out
    assert "format             messages, supervised: assistant" in out
    tokenizer = load_tokenizer(prepared["tokenizer"])
    shown = out.split("--- conversation ")[1:]
    assert len(shown) == 2
    for index, text in enumerate(shown):
        tokens, mask = data.document(index)
        assert text.startswith(f"{index} (row ")
        assert f"{len(tokens)} tokens, {int(mask.sum())} supervised [[marked]]" in text
        body = text.split("\n", 1)[1]
        assert MARKED.findall(body) == supervised_runs(tokens, mask, tokenizer)
        assert (
            MARKED.sub(r"\1", body).strip()
            == tokenizer.tokenizer.decode(tokens.tolist(), skip_special_tokens=False).strip()
        )  # every token shown once, in order
    assert "\x1b[" not in out  # not a terminal: no colour


def test_pairs_show_chosen_and_rejected_with_their_completions_marked(prepared, capsys):
    assert main(["inspect", str(prepared["pairs"]), "-n", "1", "--chars", "100000"]) == 0
    out = capsys.readouterr().out
    data = PackedDataset(prepared["pairs"])
    assert re.search(r"^pairs +6 \(from 6 records\)$", out, re.M), out
    assert f"rows               {data.num_rows} packed rows" in out
    assert "--- pair 0 (row " in out and "--- pair 1" not in out
    tokenizer = load_tokenizer(prepared["tokenizer"])
    for side, index in (("chosen", 0), ("rejected", 1)):
        tokens, mask = data.document(index)
        line = out.split(f"\n{side} (", 1)[1].split("\nrejected (", 1)[0]
        assert line.startswith(f"{len(tokens)} tokens, {int(mask.sum())} supervised): ")
        assert MARKED.findall(line) == supervised_runs(tokens, mask, tokenizer)


def test_a_terminal_sees_the_supervised_tokens_in_colour(prepared):
    """On a terminal (a pseudo-terminal here) the marked tokens are green as well."""
    primary, secondary = pty.openpty()
    env = os.environ | {"COLUMNS": "200"}
    process = subprocess.run(
        [sys.executable, "-m", "baton.tools.data.cli", "inspect", str(prepared["chat"]),
         "-n", "1"],
        stdout=secondary, stderr=subprocess.PIPE, timeout=300, env=env,
    )  # fmt: skip
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed: everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    shown = b"".join(chunks).decode()
    assert process.returncode == 0, process.stderr
    assert "[[\x1b[32m" in shown and "\x1b[0m]]" in shown
