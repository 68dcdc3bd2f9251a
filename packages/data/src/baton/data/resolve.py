"""The tokenizer a run reads its data with, chosen and checked before anything is built.

Prepared data (``baton data prepare``) records the tokenizer that made it in its
manifest. A recipe given prepared data and no tokenizer uses that one when it is still
there, unchanged; otherwise the run is refused, so prepared ids never train a model
against another vocabulary. Every recipe calls the same function first::

    from baton.data import resolve_tokenizer

    tokenizer = resolve_tokenizer(data_path, tokenizer)
    # "data/corpus", None  -> "runs/tok" (the manifest's, same fingerprint), said in one line
    # "data/corpus", "tok2" -> DataError: prepared with runs/tok, this run uses tok2 ...
    # "0.5 data/a 0.5 data/b" (two tokenizers) -> DataError: the blend mixes tokenizers
    # "corpus.jsonl", None -> None (raw text: the recipe's own choice, bytes or none)
    # None, "missing/" -> DataError: tokenizer directory missing/ does not exist ...
"""

from __future__ import annotations

import logging
from pathlib import Path

from baton.data.blend import Blend, parse_blend
from baton.data.errors import DataError
from baton.data.manifest import Manifest, check_tokenizer, read_manifest
from baton.data.tokenizer import fingerprint_file, load_tokenizer

log = logging.getLogger("baton")


def prepared_blend(data_path: str | None) -> Blend | None:
    """The blend ``data_path`` names when it is prepared data (a prefix with its
    ``.idx``, ``.bin`` or manifest beside it), else None (raw text files, or nothing)."""
    if not data_path:
        return None
    try:
        blend = parse_blend(data_path)
    except DataError:
        return None
    if any(_has_prepared_files(prefix) for prefix in blend.prefixes):
        return blend
    return None


def _has_prepared_files(prefix: str) -> bool:
    return any(Path(prefix + suffix).is_file() for suffix in (".idx", ".bin", ".json"))


def resolve_tokenizer(
    data_path: str | None, tokenizer: str | None, eval_data_path: str | None = None
) -> str | None:
    """The tokenizer directory this run reads ``data_path`` (and ``eval_data_path``) with.

    A given ``tokenizer`` must exist, and load and match every prepared dataset's manifest. Without
    one, prepared data names it: the manifest's tokenizer directory, used when it exists
    and its ``tokenizer.json`` has the recorded fingerprint (one log line says so). Raw
    text and no data leave ``tokenizer`` as it is. Raises :class:`DataError` (exit 2)
    naming the fix: a missing or changed tokenizer, data without a manifest, a blend of
    datasets prepared with different tokenizers.
    """
    blends = [b for b in (prepared_blend(data_path), prepared_blend(eval_data_path)) if b]
    for blend in blends:
        blend.check_exists()
    manifests = _manifests(blends)
    _check_one_tokenizer(manifests)
    if tokenizer is not None and not Path(tokenizer).exists():
        raise DataError(
            f"tokenizer directory {tokenizer} does not exist; pass a Hugging Face tokenizer "
            "directory, or make one with `baton data tokenizer --output DIR`"
        )
    if tokenizer is not None and manifests:
        info = load_tokenizer(tokenizer)
        for prefix in manifests:
            check_tokenizer(prefix, info)
    if tokenizer is not None:
        return tokenizer
    if not blends:
        return None
    missing = [p for blend in blends for p in blend.prefixes if p not in manifests]
    if missing:
        raise DataError(
            f"{missing[0]} is prepared data without a manifest ({missing[0]}.json) naming "
            "its tokenizer; pass --tokenizer DIR, the tokenizer it was prepared with"
        )
    prefix, manifest = next(iter(manifests.items()))
    found = _manifest_tokenizer(prefix, manifest)
    log.info(
        "%s was prepared with tokenizer %s (fingerprint %s): using it (no --tokenizer given)",
        prefix,
        found,
        manifest.tokenizer_fingerprint[:16],
    )
    return found


def _manifests(blends: list[Blend]) -> dict[str, Manifest]:
    found: dict[str, Manifest] = {}
    for blend in blends:
        for prefix in blend.prefixes:
            manifest = read_manifest(prefix)
            if manifest is not None:
                found[prefix] = manifest
    return found


def _check_one_tokenizer(manifests: dict[str, Manifest]) -> None:
    """Refuse a blend whose datasets were prepared with different tokenizers."""
    items = list(manifests.items())
    for prefix, manifest in items[1:]:
        first, theirs = items[0]
        if manifest.tokenizer_fingerprint != theirs.tokenizer_fingerprint:
            raise DataError(
                f"the data mixes tokenizers: {first} was prepared with {theirs.tokenizer_path} "
                f"(fingerprint {theirs.tokenizer_fingerprint[:16]}), {prefix} with "
                f"{manifest.tokenizer_path} (fingerprint {manifest.tokenizer_fingerprint[:16]}); "
                "prepare every dataset of a run with one tokenizer"
            )


def _manifest_tokenizer(prefix: str, manifest: Manifest) -> str:
    """The manifest's tokenizer directory as a path from here: as recorded, else beside
    the data (a relative path recorded from another working directory)."""
    recorded = Path(manifest.tokenizer_path)
    candidates = [recorded]
    if not recorded.is_absolute():
        candidates.append(Path(prefix).parent / recorded)
    for directory in candidates:
        file = directory / "tokenizer.json"
        if not file.is_file():
            continue
        if fingerprint_file(file) != manifest.tokenizer_fingerprint:
            raise DataError(
                f"{prefix} was prepared with tokenizer {recorded}, whose tokenizer.json has "
                f"changed since (fingerprint {manifest.tokenizer_fingerprint[:16]} then, "
                f"{fingerprint_file(file)[:16]} now); pass --tokenizer DIR, the tokenizer it "
                "was prepared with, or prepare the data again"
            )
        return str(directory)
    raise DataError(
        f"{prefix} was prepared with tokenizer {recorded}, which is not there (no "
        f"tokenizer.json); pass --tokenizer DIR, the tokenizer it was prepared with "
        f"(fingerprint {manifest.tokenizer_fingerprint[:16]})"
    )
