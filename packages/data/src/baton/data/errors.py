"""The one error type for bad data input: a tokenizer, a prepared dataset, a blend."""

from __future__ import annotations

from baton.core.errors import UsageError


class DataError(UsageError):
    """Bad data input; the message names the file and says how to fix it (a usage
    error: ``baton`` prints the message alone and exits 2)."""
