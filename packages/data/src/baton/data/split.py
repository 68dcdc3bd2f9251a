"""The held-out split every engine evaluates on: the last documents of the data.

``--eval-split 0.05`` holds out the last 5 % of the documents (at least one, and at least
one left to train on); training reads the documents before them. The same rule cuts a
prepared prefix, a JSON Lines file's records and a text file's paragraphs.

Example::

    first = held_out_start(1000, 0.05)     # 950: documents 950..999 are evaluated
    train, held = range(first), range(first, 1000)
"""

from __future__ import annotations

from baton.data.errors import DataError


def held_out_start(num_documents: int, eval_split: float, *, source: str = "the data") -> int:
    """The index of the first held-out document of ``num_documents`` when the last
    ``eval_split`` of them are held out (``num_documents`` when ``eval_split`` is 0)."""
    if not 0 <= eval_split < 1:
        raise DataError(f"--eval-split {eval_split} is not in [0, 1); pass e.g. --eval-split 0.05")
    if eval_split == 0:
        return num_documents
    held = max(1, round(eval_split * num_documents))
    if held >= num_documents:
        raise DataError(
            f"{source} has {num_documents} document(s): holding out {eval_split} of them "
            "leaves none to train on; use more data or a smaller --eval-split"
        )
    return num_documents - held
