"""``baton data inspect PREFIX`` on prompts (GRPO's): counts, the longest prompt, and the
first prompts decoded with their columns.

One describer of ``baton.tools.data.describe.KINDS``.

Example::

    baton data inspect data/math -n 2        # tokenizer from the manifest
    rollout_prompts("data/math", None, count=2, chars=400, color=False)   # the report's lines
"""

from __future__ import annotations

from pathlib import Path

from baton.data import TokenizerInfo, load_tokenizer
from baton.data.prompts import PreparedPrompts


def _shown(value: object, chars: int) -> str:
    text = repr(value)
    return text if len(text) <= chars else text[:chars] + " [...]"


def rollout_prompts(
    prefix: str | Path, tokenizer: str | Path | None, count: int, chars: int, color: bool
) -> list[str]:
    """Prompts: their count and tokens, the longest, the columns, the first prompts
    decoded with their columns (``color`` unused: nothing is supervised)."""
    prompts = PreparedPrompts(prefix)
    manifest = prompts.manifest
    recorded = manifest["tokenizer"]
    longest = int(prompts.indexed.sequence_lengths.argmax())
    template = prompts.template
    lines = [
        f"prompts    {prompts.prefix}: {len(prompts):,} prompts, {manifest['tokens']:,} tokens "
        f"({'turns, chat template ' + template['sha256'][:16] if template else 'text'})",
        f"longest    {prompts.max_prompt_length:,} tokens (prompt {longest})",
        f"columns    {', '.join(prompts.columns) or 'none'}",
        f"tokenizer  {recorded['path']} (fingerprint {recorded['fingerprint'][:16]}, "
        f"{recorded['vocab_size']:,} tokens)",
    ]
    info: TokenizerInfo | None = None
    directory = tokenizer if tokenizer is not None else recorded["path"]
    if tokenizer is not None or Path(directory).is_dir():
        info = load_tokenizer(directory)
        prompts.check_tokenizer(info)
    for index in range(min(count, len(prompts))):
        ids = prompts.ids(index)
        lines.append(f"--- prompt {index}: {len(ids):,} tokens")
        if info is None:
            lines.append(" ".join(str(t) for t in ids[:64].tolist()))
        else:
            text = info.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
            lines.append(text if len(text) <= chars else text[:chars] + " [...]")
        record = prompts.record(index)
        for column in prompts.columns:
            lines.append(f"{column}: {_shown(record.get(column), chars)}")
    if count and info is None:
        lines.append("(token ids: pass --tokenizer DIR to decode)")
    return lines
