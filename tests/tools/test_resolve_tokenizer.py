"""Prepared data names its tokenizer: ``resolve_tokenizer`` uses the manifest's when it is
there and unchanged, and refuses (exit status 2) whatever would train prepared ids against
another vocabulary."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from baton.data import DataError, resolve_tokenizer, train_tokenizer
from baton.tools.data.prepare import prepare


@pytest.fixture
def prepared(tmp_path: Path) -> tuple[str, Path]:
    """A prefix prepared with a small tokenizer of its own (so a test may change it)."""
    tok = tmp_path / "tok"
    train_tokenizer(tok, vocab_size=320, texts=["def f(x): return x + 1\n" * 50])
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(json.dumps({"text": f"def f{i}(): return {i}\n" * 20}) + "\n" for i in range(20)),
        encoding="utf-8",
    )
    prefix = tmp_path / "data" / "corpus"
    prepare([docs], tok, prefix, workers=1)
    return str(prefix), tok


def test_prepared_data_without_tokenizer_uses_the_manifests(prepared, caplog):
    prefix, tok = prepared
    with caplog.at_level(logging.INFO, logger="baton"):
        assert resolve_tokenizer(prefix, None) == str(tok)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"prepared with tokenizer {tok}" in said[0], said
    assert resolve_tokenizer(prefix + ".bin", None) == str(tok)  # a file of the prefix too
    assert resolve_tokenizer(f"0.3 {prefix} 0.7 {prefix}", None) == str(tok)


def test_the_given_tokenizer_must_match(prepared, tmp_path):
    prefix, tok = prepared
    assert resolve_tokenizer(prefix, str(tok)) == str(tok)
    other = train_tokenizer(tmp_path / "other", vocab_size=300, texts=["def g(): pass\n" * 50])
    with pytest.raises(DataError, match="prepared with tokenizer .* but this run uses") as error:
        resolve_tokenizer(prefix, str(other.path))
    assert error.value.exit_status == 2


def test_a_missing_or_changed_tokenizer_is_refused(prepared):
    prefix, tok = prepared
    config = tok / "tokenizer.json"
    config.write_text(config.read_text(encoding="utf-8") + " ", encoding="utf-8")
    with pytest.raises(DataError, match="tokenizer.json has changed since .* pass --tokenizer"):
        resolve_tokenizer(prefix, None)
    shutil.rmtree(tok)
    with pytest.raises(DataError, match=r"which is not there .* pass --tokenizer DIR"):
        resolve_tokenizer(prefix, None)


def test_a_blend_of_two_tokenizers_is_refused(prepared, tmp_path):
    prefix, _ = prepared
    other = train_tokenizer(tmp_path / "other", vocab_size=300, texts=["def g(): pass\n" * 50])
    second = tmp_path / "data" / "second"
    prepare([tmp_path / "docs.jsonl"], other, second, workers=1)
    for tokenizer in (None, str(other.path)):
        with pytest.raises(DataError, match="the data mixes tokenizers: .* one tokenizer"):
            resolve_tokenizer(f"0.5 {prefix} 0.5 {second}", tokenizer)


def test_data_without_a_manifest_needs_the_flag(prepared):
    prefix, tok = prepared
    Path(prefix + ".json").unlink()
    with pytest.raises(DataError, match=r"without a manifest .* pass --tokenizer DIR"):
        resolve_tokenizer(prefix, None)
    assert resolve_tokenizer(prefix, str(tok)) == str(tok)  # unchecked, as before


def test_raw_text_and_missing_tokenizers(tmp_path):
    text = tmp_path / "corpus.jsonl"
    text.write_text('{"text": "x"}\n', encoding="utf-8")
    assert resolve_tokenizer(str(text), None) is None  # the recipe's own choice (bytes)
    assert resolve_tokenizer(None, None) is None
    with pytest.raises(DataError, match="tokenizer directory .*absent does not exist") as error:
        resolve_tokenizer(str(text), str(tmp_path / "absent"))
    assert error.value.exit_status == 2
