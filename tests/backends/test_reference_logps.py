"""DPO's reference log-probabilities stored beside the data: computed once, read back for
the same reference, tokenizer and data, refused for another tokenizer or other data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from baton.backends.reference_logps import (
    model_fingerprint,
    reference_paths,
    stored_or_computed,
)
from baton.core.errors import UsageError


@pytest.fixture
def prefix(tmp_path):
    for suffix in (".bin", ".idx", ".mask.bin"):
        (tmp_path / f"pairs{suffix}").write_bytes(b"tokens" + suffix.encode())
    return tmp_path / "pairs"


def test_computed_once_then_read_back(prefix):
    calls = []

    def compute():
        calls.append(1)
        return np.array([-1.5, -2.25, -3.0, -4.0])

    first = stored_or_computed(prefix, "ab" * 32, tokenizer_fingerprint="t", engine="fabric",
                               compute=compute, num_sequences=4)  # fmt: skip
    again = stored_or_computed(prefix, "ab" * 32, tokenizer_fingerprint="t", engine="fabric",
                               compute=compute, num_sequences=4)  # fmt: skip
    assert calls == [1] and np.array_equal(first, again) and again.dtype == np.float64
    array, record = reference_paths(prefix, "ab" * 32)
    assert array.name == "pairs.reference-abababababababab.npy"
    assert json.loads(record.read_text())["engine"] == "fabric"


def test_another_tokenizer_or_other_data_is_refused(prefix):
    def compute():
        return np.zeros(2)

    stored_or_computed(prefix, "cd" * 32, tokenizer_fingerprint="t", engine="fabric",
                       compute=compute)  # fmt: skip
    with pytest.raises(UsageError, match="another tokenizer"):
        stored_or_computed(prefix, "cd" * 32, tokenizer_fingerprint="u", engine="fabric",
                           compute=compute)  # fmt: skip
    (prefix.parent / "pairs.bin").write_bytes(b"other tokens")
    with pytest.raises(UsageError, match="another data"):
        stored_or_computed(prefix, "cd" * 32, tokenizer_fingerprint="t", engine="fabric",
                           compute=compute)  # fmt: skip


def test_a_model_fingerprint_follows_its_weights(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    before = model_fingerprint(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"other": 1}')
    assert model_fingerprint(tmp_path) == before  # tokenizer files are not weights
    (tmp_path / "model.safetensors").write_bytes(b"weights2")
    assert model_fingerprint(tmp_path) != before
    with pytest.raises(UsageError, match="not found"):
        model_fingerprint(tmp_path / "missing")
