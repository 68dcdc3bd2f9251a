"""Bad input to `baton data`: one clear line, exit status 2, and no output that looks complete."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from baton.tools.data.cli import main


def run(capsys, *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    err = capsys.readouterr().err
    return status, err


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def good_lines(count: int) -> str:
    return "".join(json.dumps({"text": f"document {i} " * 50}) + "\n" for i in range(count))


# name -> (files to create {name: content}, inputs, extra args, words the message must contain)
CASES = {
    "missing file": ({}, ["absent.jsonl"], [], ["absent.jsonl does not exist"]),
    "unknown suffix": ({"data.csv": "a,b\n"}, ["data.csv"], [], ["unknown input type '.csv'"]),
    "missing text key": (
        {"docs.jsonl": good_lines(3000) + json.dumps({"body": "x", "id": 1}) + "\n"},
        ["docs.jsonl"],
        [],
        ["docs.jsonl line 3001 has no key 'text'", "its keys: body, id", "--text-key"],
    ),
    "text key not text": (
        {"docs.jsonl": json.dumps({"text": 3}) + "\n"},
        ["docs.jsonl"],
        [],
        ["docs.jsonl line 1: 'text' is a int, not text"],
    ),
    "line not JSON": (
        {"docs.jsonl": good_lines(2) + "{broken\n"},
        ["docs.jsonl"],
        [],
        ["docs.jsonl line 3 is not JSON", "JSON Lines"],
    ),
    "txt not UTF-8": (
        {"latin.txt": "caf\xe9 au lait".encode("latin-1")},
        ["latin.txt"],
        [],
        ["latin.txt is not UTF-8 text (byte 0xe9 at offset 3)", "iconv"],
    ),
    "jsonl not UTF-8": (
        {"docs.jsonl": good_lines(1).encode() + b'{"text": "caf\xe9"}\n'},
        ["docs.jsonl"],
        [],
        ["docs.jsonl line 2 is not UTF-8 text"],
    ),
    "empty corpus": (
        {"empty.txt": "", "blank.jsonl": json.dumps({"text": "  "}) + "\n"},
        ["empty.txt", "blank.jsonl"],
        [],
        ["no text in empty.txt, blank.jsonl (2 empty documents)", "--text-key"],
    ),
    "missing parquet column": (
        {}, ["docs.parquet"], [], ["docs.parquet has no column 'text' (its columns: body)"],
    ),
    "not a dataset directory": (
        {"folder/readme.txt": "x"}, ["folder"], [], ["not a dataset saved with `save_to_disk`"],
    ),
    "tokenizer directory missing": (
        {"a.txt": "text"}, ["a.txt"], ["--tokenizer", "nowhere"],
        ["tokenizer directory nowhere does not exist", "baton data tokenizer"],
    ),
    "tokenizer directory without tokenizer.json": (
        {"a.txt": "text", "emptytok/README": "x"}, ["a.txt"], ["--tokenizer", "emptytok"],
        ["emptytok has no tokenizer.json"],
    ),
    "tokenizer.json unreadable": (
        {"a.txt": "text", "badtok/tokenizer.json": "{not json"}, ["a.txt"],
        ["--tokenizer", "badtok"], ["badtok/tokenizer.json is not a tokenizer"],
    ),
    "workers below one": ({"a.txt": "text"}, ["a.txt"], ["--workers", "0"], ["--workers must"]),
    "output is a directory": (
        {"a.txt": "text", "out/keep": "x"}, ["a.txt"], ["--output", "out"],
        ["--output out is a directory; give a prefix inside it, e.g. out/corpus"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bad_prepare_input_is_one_line_and_leaves_nothing(
    case, tokenizer, tmp_path, capsys, monkeypatch
):
    files, inputs, extra, words = CASES[case]
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        write(Path(name), content)
    if case == "missing parquet column":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": ["x"]}), "docs.parquet")
    args = ["prepare", *inputs, *extra]
    if "--output" not in extra:
        args += ["--output", "out/data"]
    if "--tokenizer" not in extra:
        args += ["--tokenizer", str(tokenizer.path)]
    status, err = run(capsys, *args)
    assert status == 2
    assert err.startswith("baton data prepare: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"
    leftovers = sorted(p.name for p in Path("out").glob("*")) if Path("out").exists() else []
    assert leftovers == (["keep"] if "out/keep" in files else []), (
        f"a failed prepare left {leftovers}"
    )


def test_existing_output_is_kept_without_force_and_after_a_failed_force(
    tokenizer, tmp_path, capsys
):
    good = write(tmp_path / "good.jsonl", good_lines(5))
    out = str(tmp_path / "data")
    assert (
        run(capsys, "prepare", str(good), "--tokenizer", str(tokenizer.path), "--output", out)[0]
        == 0
    )
    before = {p.name: p.read_bytes() for p in tmp_path.glob("data.*")}
    assert sorted(before) == ["data.bin", "data.idx", "data.json"]

    status, err = run(
        capsys, "prepare", str(good), "--tokenizer", str(tokenizer.path), "--output", out
    )
    assert status == 2 and "already exist; pass --force" in err
    bad = write(tmp_path / "bad.jsonl", good_lines(5) + "{broken\n")
    args = ["prepare", str(bad), "--tokenizer", str(tokenizer.path), "--output", out, "--force"]
    assert run(capsys, *args)[0] == 2
    after = {p.name: p.read_bytes() for p in tmp_path.glob("data.*")}
    assert after == before  # nothing already written was lost, no temporaries left


def test_uint16_refuses_a_vocabulary_it_cannot_hold(tmp_path, capsys) -> None:
    from tokenizers import Tokenizer, models

    vocab = {"<|endoftext|>": 0} | {f"w{i}": i + 1 for i in range(66_000)}
    (tmp_path / "tok").mkdir()
    Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0")).save(
        str(tmp_path / "tok/tokenizer.json")
    )
    write(tmp_path / "a.txt", "w1 w2")
    args = ["prepare", str(tmp_path / "a.txt"), "--tokenizer", str(tmp_path / "tok")]
    status, err = run(capsys, *args, "--output", str(tmp_path / "x"), "--dtype", "uint16")
    assert status == 2
    assert "has 66001 tokens but uint16 holds ids up to 65535; use --dtype int32" in err


def test_dataset_dict_directory_names_its_splits(tmp_path, tokenizer, capsys) -> None:
    import datasets

    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a"]}),
            "test": datasets.Dataset.from_dict({"text": ["b"]}),
        }
    )
    splits.save_to_disk(str(tmp_path / "dd"))
    args = [
        "prepare",
        str(tmp_path / "dd"),
        "--tokenizer",
        str(tokenizer.path),
        "--output",
        str(tmp_path / "o"),
    ]
    status, err = run(capsys, *args)
    assert status == 2 and "holds several splits (test, train); pass one of them" in err


def test_inspect_bad_prefix_and_unknown_command(tmp_path, capsys) -> None:
    status, err = run(capsys, "inspect", str(tmp_path / "nothing"))
    assert status == 2 and "no prepared dataset at" in err and "baton data prepare" in err
    status, err = run(capsys, "frobnicate")
    assert status == 2 and "unknown command" in err


def test_tokenizer_command_refuses_to_overwrite(tmp_path, tokenizer, capsys) -> None:
    shutil.copytree(tokenizer.path, tmp_path / "tok")
    status, err = run(capsys, "tokenizer", "--vocab-size", "300", "--output", str(tmp_path / "tok"))
    assert status == 2 and "already exists; pass --force" in err
    status, err = run(capsys, "tokenizer", "--vocab-size", "100", "--output", str(tmp_path / "t2"))
    assert status == 2 and "vocab size 100 is too small" in err


def test_tokenizer_trains_on_the_documents_of_jsonl_not_its_json(tmp_path, capsys) -> None:
    """`baton data tokenizer --input x.jsonl` reads the documents as `prepare` does: the
    tokenizer equals one trained on the same texts, and learns nothing of JSON escapes."""
    from baton.data import train_tokenizer

    texts = [
        f"Line {i} of a note.\nDESCRIPTION: item {i % 7} costs {i * 3} units.\n" for i in range(300)
    ]
    corpus = write(tmp_path / "notes.jsonl", "".join(json.dumps({"body": t}) + "\n" for t in texts))
    status, err = run(
        capsys, "tokenizer", "--input", str(corpus), "--text-key", "body",
        "--vocab-size", "400", "--output", str(tmp_path / "tok"),
    )  # fmt: skip
    assert status == 0, err
    expected = train_tokenizer(tmp_path / "direct", vocab_size=400, texts=texts)
    learned = (tmp_path / "tok" / "tokenizer.json").read_text()
    assert learned == (expected.path / "tokenizer.json").read_text()
    assert '"body"' not in learned and "nDESCRIPTION" not in learned
    status, err = run(
        capsys, "tokenizer", "--input", str(corpus), "--vocab-size", "400",
        "--output", str(tmp_path / "t3"),
    )  # fmt: skip
    assert status == 2 and "has no key 'text'" in err and "--text-key" in err
