"""The one error type for bad data input: a tokenizer, a prepared dataset, a blend."""

from __future__ import annotations


class DataError(ValueError):
    """Bad data input; the message names the file and says how to fix it."""
