"""Hugging Face tokenizers from a local directory, and a small one trained offline.

Example::

    from baton.data import load_tokenizer, train_tokenizer

    info = train_tokenizer("runs/tok", vocab_size=1024)   # byte-level BPE on the CPython reference
    info = load_tokenizer("runs/tok")
    info.vocab_size, info.eod_id, info.fingerprint         # 1024, 0, "3f2a..."
    ids = info.tokenizer.encode("def f(): pass").ids      # a ``tokenizers.Tokenizer``

A tokenizer directory is what ``save_pretrained`` writes for a fast tokenizer:
``tokenizer.json`` (read with the ``tokenizers`` library) plus ``tokenizer_config.json``
(and often ``special_tokens_map.json``) naming the special tokens. The fingerprint is the
SHA-256 of ``tokenizer.json``: two directories with the same file tokenize identically.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.data.errors import DataError

#: the end-of-document token of tokenizers made by :func:`train_tokenizer`
END_OF_TEXT = "<|endoftext|>"
#: the padding token of tokenizers made by :func:`train_tokenizer` (never in prepared data)
PAD = "<|pad|>"
#: end-of-document tokens looked up, in order, when the configuration names none
KNOWN_EOD_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")


@dataclass(frozen=True)
class TokenizerInfo:
    """A loaded tokenizer directory: what every backend needs to know about it."""

    path: Path
    #: rows the embedding needs: the vocabulary including added (special) tokens
    vocab_size: int
    #: the end-of-document token appended after every document, and its id
    eod_token: str
    eod_id: int
    #: SHA-256 (hex) of tokenizer.json
    fingerprint: str
    tokenizer: Any = field(repr=False, compare=False)  # tokenizers.Tokenizer

    @property
    def short_fingerprint(self) -> str:
        return self.fingerprint[:16]


def fingerprint_file(path: str | Path) -> str:
    """SHA-256 hex digest of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _token_content(value: Any) -> str | None:
    """A special token as configured: ``"<s>"`` or ``{"content": "<s>", ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is not valid JSON ({error}); fix or remove it") from None
    return data if isinstance(data, dict) else {}


def _eod_token(directory: Path, tokenizer: Any, eod_token: str | None) -> tuple[str, int]:
    candidates: list[tuple[str, str]] = []
    if eod_token is not None:
        candidates.append((eod_token, "the eod_token argument"))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        token = _token_content(_read_json(directory / name).get("eos_token"))
        if token is not None:
            candidates.append((token, f"eos_token in {name}"))
    if candidates:
        token, where = candidates[0]
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise DataError(
                f"tokenizer {directory}: {where} is {token!r}, which is not in its vocabulary; "
                "fix eos_token in tokenizer_config.json"
            )
        return token, int(token_id)
    for token in KNOWN_EOD_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token, int(token_id)
    raise DataError(
        f"tokenizer {directory} names no end-of-document token; set eos_token in its "
        'tokenizer_config.json (e.g. "<|endoftext|>")'
    )


def load_tokenizer(path: str | Path, eod_token: str | None = None) -> TokenizerInfo:
    """Load a Hugging Face tokenizer directory (or its ``tokenizer.json``) without the network.

    The end-of-document token is ``eod_token`` if given, else ``eos_token`` from
    ``tokenizer_config.json`` or ``special_tokens_map.json``, else a well-known one
    (``<|endoftext|>``, ``</s>``, ...). Raises :class:`DataError` for a missing directory,
    a directory without ``tokenizer.json``, or a file ``tokenizers`` cannot read.
    """
    given = Path(path)
    directory = given.parent if given.name == "tokenizer.json" else given
    if not directory.exists():
        raise DataError(
            f"tokenizer directory {directory} does not exist; pass a Hugging Face tokenizer "
            "directory, or make one with `baton data tokenizer --output DIR`"
        )
    if not directory.is_dir():
        raise DataError(
            f"tokenizer {directory} is not a directory; pass the directory that holds tokenizer.json"
        )
    file = directory / "tokenizer.json"
    if not file.is_file():
        others = sorted(p.name for p in directory.glob("*.model")) + sorted(
            p.name for p in directory.glob("*.tiktoken")
        )
        if others:
            raise DataError(
                f"tokenizer directory {directory} has {', '.join(others)} but no tokenizer.json; "
                "convert it once with transformers: AutoTokenizer.from_pretrained(DIR)"
                ".save_pretrained(DIR) writes tokenizer.json"
            )
        raise DataError(
            f"tokenizer directory {directory} has no tokenizer.json; pass a Hugging Face "
            "tokenizer directory (a fast tokenizer's save_pretrained writes one), or make one "
            "with `baton data tokenizer --output DIR`"
        )
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(
            f"{file} is not a tokenizer the tokenizers library can read ({first_line}); "
            "save it again with save_pretrained or `baton data tokenizer`"
        ) from None
    token, token_id = _eod_token(directory, tokenizer, eod_token)
    return TokenizerInfo(
        path=directory,
        vocab_size=int(tokenizer.get_vocab_size(with_added_tokens=True)),
        eod_token=token,
        eod_id=token_id,
        fingerprint=fingerprint_file(file),
        tokenizer=tokenizer,
    )


def special_token_ids(info: TokenizerInfo) -> dict[str, int | None]:
    """The ids a model generating with this tokenizer needs, as Hugging Face names them:
    ``bos_token_id`` and ``pad_token_id`` from ``tokenizer_config.json`` (or
    ``special_tokens_map.json``), ``None`` where the tokenizer names none, and
    ``eos_token_id``, the end-of-document id the data was prepared with.

    Example::

        special_token_ids(train_tokenizer("runs/tok"))
        # {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1}
    """
    ids: dict[str, int | None] = {"bos_token_id": None, "eos_token_id": info.eod_id}
    ids["pad_token_id"] = None
    for role in ("bos", "pad"):
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            token = _token_content(_read_json(info.path / name).get(f"{role}_token"))
            token_id = None if token is None else info.tokenizer.token_to_id(token)
            if token_id is not None:
                ids[f"{role}_token_id"] = int(token_id)
                break
    return ids


def _read_training_files(files: Iterable[str | Path]) -> list[str]:
    texts = []
    for name in files:
        file = Path(name)
        if not file.is_file():
            raise DataError(f"tokenizer training input {file} is not a file; pass UTF-8 text files")
        try:
            texts.append(file.read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise DataError(
                f"{file} is not UTF-8 text (byte offset {error.start}); convert it to UTF-8"
            ) from None
    return texts


def _training_corpus(texts: Iterable[str] | None, files: Iterable[str | Path] | None) -> list[str]:
    """The tokenizer's training text: ``texts``, else the ``files``, else the Python
    language reference; ``DataError`` when it is empty."""
    if texts is not None:
        corpus = list(texts)
    elif files is not None:
        corpus = _read_training_files(files)
    else:
        from baton.data.corpus import reference_documents

        corpus = reference_documents()
    if not any(text.strip() for text in corpus):
        raise DataError("tokenizer training text is empty; pass files that contain text")
    return corpus


def _save_tokenizer_files(tokenizer: Any, directory: Path, specials: list[str]) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` of a
    trained byte-level BPE (``specials``: end of text, padding) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    special = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "pad_token": PAD}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
        "added_tokens_decoder": {
            str(tokenizer.token_to_id(token)): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token in specials
        },
    }
    for name, content in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        (directory / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def train_tokenizer(
    output: str | Path,
    *,
    vocab_size: int = 1024,
    files: Iterable[str | Path] | None = None,
    texts: Iterable[str] | None = None,
    min_frequency: int = 2,
) -> TokenizerInfo:
    """Train a byte-level BPE on local text and save it as a Hugging Face tokenizer directory.

    The text is ``texts`` if given, else the UTF-8 ``files``, else the Python language
    reference that ships with CPython (one document per topic). Training is deterministic:
    the same text and settings give the same ``tokenizer.json``. The directory gets
    ``tokenizer.json``, ``tokenizer_config.json`` (``PreTrainedTokenizerFast``, loadable by
    ``transformers.AutoTokenizer`` 4.x and 5.x) and ``special_tokens_map.json``, with
    ``<|endoftext|>`` as end-of-document (eos and bos) token and ``<|pad|>`` for padding.
    ``vocab_size`` counts those two and the 256 byte tokens; a small corpus may stop short
    of it (the returned info says the real size).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = [END_OF_TEXT, PAD]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials):
        raise DataError(
            f"vocab size {vocab_size} is too small for a byte-level BPE: it needs at least "
            f"{len(alphabet) + len(specials)} (256 bytes and {len(specials)} special tokens)"
        )
    corpus = _training_corpus(texts, files)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)

    directory = Path(output)
    _save_tokenizer_files(tokenizer, directory, specials)
    return load_tokenizer(directory)


def check_model_vocab(tokenizer: TokenizerInfo, model_vocab_size: int) -> None:
    """Raise :class:`DataError` if the tokenizer has more tokens than the model has rows."""
    if tokenizer.vocab_size > model_vocab_size:
        raise DataError(
            f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens but the model's "
            f"vocabulary has {model_vocab_size} rows; set the model's vocab size to at least "
            f"{tokenizer.vocab_size}, or use a smaller tokenizer"
        )
