"""baton.data: tokenizers offline, the prepared-data reader's checks, blends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from baton.data import (
    DataError,
    PreparedDataset,
    check_model_vocab,
    check_tokenizer,
    load_tokenizer,
    parse_blend,
    train_tokenizer,
)
from baton.tools.data.prepare import prepare


def test_tokenizer_training_is_deterministic_and_loads_everywhere(tokenizer, tmp_path) -> None:
    again = train_tokenizer(tmp_path / "again", vocab_size=512)
    assert (again.path / "tokenizer.json").read_bytes() == (
        tokenizer.path / "tokenizer.json"
    ).read_bytes()
    assert again.fingerprint == tokenizer.fingerprint and len(tokenizer.fingerprint) == 64
    assert (tokenizer.vocab_size, tokenizer.eod_token, tokenizer.eod_id) == (
        512,
        "<|endoftext|>",
        0,
    )
    names = sorted(p.name for p in tokenizer.path.iterdir())
    assert names == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    # transformers' AutoTokenizer and tokenizers' Tokenizer load it with the hub offline
    text = "def f(x):\n    return x ** 2  # café"
    script = f"""
import json, sys
from tokenizers import Tokenizer
from transformers import AutoTokenizer
auto = AutoTokenizer.from_pretrained({str(tokenizer.path)!r})
raw = Tokenizer.from_file({str(tokenizer.path / "tokenizer.json")!r})
text = {text!r}
print(json.dumps([auto.encode(text), raw.encode(text).ids, auto.eos_token_id, auto.pad_token_id,
                  len(auto), auto.decode(auto.encode(text))]))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr
    auto_ids, raw_ids, eos, pad, size, decoded = json.loads(run.stdout.strip().splitlines()[-1])
    assert auto_ids == raw_ids == tokenizer.tokenizer.encode(text).ids
    assert (eos, pad, size, decoded) == (0, 1, 512, text)


def test_tokenizer_errors_name_the_directory_and_the_fix(tokenizer, tmp_path) -> None:
    with pytest.raises(DataError, match=r"does not exist; pass a Hugging Face tokenizer directory"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty has no tokenizer.json"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "empty" / "tokenizer.model").write_bytes(b"\0")
    with pytest.raises(DataError, match=r"has tokenizer.model but no tokenizer.json; convert it"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match=r"is not a directory"):
        load_tokenizer(tmp_path / "file")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(DataError, match=r"broken/tokenizer.json is not a tokenizer"):
        load_tokenizer(broken)
    wrong_eos = tmp_path / "wrong_eos"
    shutil.copytree(tokenizer.path, wrong_eos)
    config = json.loads((wrong_eos / "tokenizer_config.json").read_text())
    (wrong_eos / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "</nope>"}))
    with pytest.raises(
        DataError, match=r"eos_token in tokenizer_config.json is '</nope>', which is not"
    ):
        load_tokenizer(wrong_eos)
    assert load_tokenizer(wrong_eos, eod_token="<|pad|>").eod_id == 1
    with pytest.raises(DataError, match=r"has 512 tokens but the model's vocabulary has 256 rows"):
        check_model_vocab(tokenizer, 256)
    check_model_vocab(tokenizer, 512)
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9")
    with pytest.raises(DataError, match=r"latin.txt is not UTF-8"):
        train_tokenizer(tmp_path / "t", vocab_size=300, files=[tmp_path / "latin.txt"])


@pytest.fixture(scope="module")
def small(tmp_path_factory, tokenizer) -> Path:
    root = tmp_path_factory.mktemp("small")
    (root / "a.jsonl").write_text(
        "".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(20)),
        encoding="utf-8",
    )
    prepare([root / "a.jsonl"], tokenizer, root / "data", workers=1)
    return root / "data"


def damaged(small: Path, tmp_path: Path, keep: tuple[str, ...] = (".bin", ".idx", ".json")) -> Path:
    for suffix in keep:
        shutil.copy(f"{small}{suffix}", tmp_path / f"copy{suffix}")
    return tmp_path / "copy"


def test_reader_accepts_the_prefix_or_a_file_name(small) -> None:
    for name in (small, f"{small}.bin", f"{small}.idx"):
        data = PreparedDataset(name)
        assert (data.num_documents, data.prefix) == (20, str(small))
    assert "20 documents" in repr(data)
    with pytest.raises(IndexError):
        data.document(20)


def test_reader_refuses_damaged_data_naming_the_file(small, tmp_path) -> None:
    only_bin = damaged(small, tmp_path, keep=(".bin",))
    with pytest.raises(DataError, match=r"copy.bin has no index .*copy.idx.*baton data prepare"):
        PreparedDataset(only_bin)
    os.remove(f"{only_bin}.bin")
    shutil.copy(f"{small}.idx", f"{only_bin}.idx")
    with pytest.raises(DataError, match=r"copy.idx has no data file"):
        PreparedDataset(only_bin)
    with pytest.raises(DataError, match=r"no prepared dataset at .*nothing"):
        PreparedDataset(tmp_path / "nothing")

    prefix = damaged(small, tmp_path)
    bin_bytes = Path(f"{prefix}.bin").read_bytes()
    Path(f"{prefix}.bin").write_bytes(bin_bytes[:-6])
    with pytest.raises(
        DataError, match=r"copy.bin is truncated: \d+ bytes, copy.idx describes \d+"
    ):
        PreparedDataset(prefix)
    Path(f"{prefix}.bin").write_bytes(bin_bytes + b"\0\0")
    with pytest.raises(DataError, match=r"copy.bin is longer than its index says"):
        PreparedDataset(prefix)
    Path(f"{prefix}.bin").write_bytes(bin_bytes)

    idx_bytes = Path(f"{prefix}.idx").read_bytes()
    Path(f"{prefix}.idx").write_bytes(b"NOTANIDX!" + idx_bytes[9:])
    with pytest.raises(DataError, match=r"copy.idx is not a Megatron indexed-dataset index"):
        PreparedDataset(prefix)
    Path(f"{prefix}.idx").write_bytes(idx_bytes[:40])
    with pytest.raises(DataError, match=r"copy.idx is truncated: 40 bytes"):
        PreparedDataset(prefix)
    Path(f"{prefix}.idx").write_bytes(idx_bytes[:9] + b"\2" + idx_bytes[10:])
    with pytest.raises(DataError, match=r"index version 2"):
        PreparedDataset(prefix)


def test_a_different_tokenizer_is_refused_naming_both_fingerprints(
    small, tokenizer, tmp_path
) -> None:
    other = train_tokenizer(tmp_path / "other", vocab_size=400)
    with pytest.raises(DataError) as error:
        PreparedDataset(small).check_tokenizer(other)
    message = str(error.value)
    assert tokenizer.fingerprint[:16] in message and other.fingerprint[:16] in message
    assert "prepare the data again with this one" in message
    assert check_tokenizer(small, tokenizer).documents == 20
    prefix = damaged(small, tmp_path, keep=(".bin", ".idx"))
    assert PreparedDataset(prefix).check_tokenizer(other) is None  # no manifest: not checkable
    Path(f"{prefix}.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"copy.json is not a baton data manifest"):
        PreparedDataset(prefix).manifest()


def test_blends_parse_megatron_style(small) -> None:
    blend = parse_blend("0.7 data/web 0.3 data/code.bin")
    assert blend.prefixes == ("data/web", "data/code") and blend.weights == (0.7, 0.3)
    assert blend.megatron() == (["data/web", "data/code"], [0.7, 0.3])
    assert str(blend) == "0.7 data/web 0.3 data/code"
    assert blend.maxtext() == "data/web,0.7;data/code,0.3"
    assert parse_blend("a b").maxtext() == "a,1;b,1" and parse_blend("a").maxtext() == "a"
    assert parse_blend(["2", "a", "6", "b"]).normalized_weights() == (0.25, 0.75)
    single = parse_blend(f"  {small}  ")
    assert single.prefixes == (str(small),) and single.weights is None
    assert single.normalized_weights() == (1.0,)
    single.check_exists()
    assert parse_blend("a b").megatron() == (["a", "b"], None)
    for bad, words in {
        "": "the data path is empty",
        "0.7 a 0.3": "does not parse",
        "a 0.3 b 0.7": "does not parse",
        "0.7 a b": "does not parse",
        "0.7 0.3 a b": "does not parse",
        "-1 a 2 b": "weight '-1' must be a positive finite number",
        "nan a": "weight 'nan' must be a positive finite number",
        "0 a": "weight '0' must be",
    }.items():
        with pytest.raises(DataError, match=words):
            parse_blend(bad)
    with pytest.raises(DataError, match=r"no prepared dataset at missing"):
        parse_blend(f"1 {small} 1 missing").check_exists()


def test_importing_textdata_pulls_in_no_framework() -> None:
    script = (
        "import sys, baton.data\n"
        "print(sorted(m for m in ('torch', 'jax', 'megatron', 'tokenizers', 'transformers') "
        "if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
