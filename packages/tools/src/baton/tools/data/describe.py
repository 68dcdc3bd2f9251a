"""``baton data inspect PREFIX``: counts, dtype, manifest and the first documents decoded.

Example::

    baton data inspect data/corpus                     # tokenizer from the manifest
    baton data inspect data/corpus --tokenizer runs/tok -n 5
"""

from __future__ import annotations

from pathlib import Path

from baton.data import DataError, PreparedDataset, TokenizerInfo, load_tokenizer


def describe(
    prefix: str | Path, tokenizer: str | Path | None = None, count: int = 3, chars: int = 400
) -> str:
    """The report ``baton data inspect`` prints."""
    data = PreparedDataset(prefix)
    manifest = data.manifest()
    lines = [
        f"dataset    {data.prefix} ({data.bin_path.stat().st_size:,} bytes .bin)",
        f"documents  {data.num_documents:,}",
        f"sequences  {data.num_sequences:,}",
        f"tokens     {data.num_tokens:,}",
        f"dtype      {data.dtype.name}",
    ]
    if manifest is None:
        lines.append("manifest   none (not prepared by baton: the tokenizer cannot be checked)")
    else:
        lines += [
            f"manifest   {Path(data.prefix + '.json')}",
            f"tokenizer  {manifest.tokenizer_path} (fingerprint "
            f"{manifest.tokenizer_fingerprint[:16]}, {manifest.vocab_size:,} tokens, "
            f"end of document {manifest.eod_token!r} = {manifest.eod_id})",
            f"skipped    {manifest.skipped_empty:,} empty documents",
        ]
        for source in manifest.sources:
            lines.append(
                f"source     {source.path}: {source.bytes:,} bytes, {source.documents:,} "
                f"documents, {source.tokens:,} tokens"
            )
    info: TokenizerInfo | None = None
    if tokenizer is not None:
        info = load_tokenizer(tokenizer)
        data.check_tokenizer(info)
    elif manifest is not None and Path(manifest.tokenizer_path).is_dir():
        info = load_tokenizer(manifest.tokenizer_path)
        data.check_tokenizer(info)
    shown = min(count, data.num_documents)
    for index in range(shown):
        tokens = data.document(index)
        lines.append(f"--- document {index}: {len(tokens):,} tokens")
        if info is None:
            lines.append(" ".join(str(t) for t in tokens[:64].tolist()))
        else:
            text = info.tokenizer.decode(tokens.tolist(), skip_special_tokens=False)
            lines.append(text if len(text) <= chars else text[:chars] + " [...]")
    if shown and info is None:
        lines.append("(token ids: pass --tokenizer DIR to decode)")
    return "\n".join(lines)


__all__ = ["DataError", "describe"]
