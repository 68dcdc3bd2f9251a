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
from baton.data.indexed import PreparedDataset


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


def held_out_tokens(data: PreparedDataset, eval_split: float) -> int:
    """The position, among all of ``data``'s tokens, of the first held-out document's
    first token (``data.num_tokens`` when nothing is held out)::

        cut = held_out_tokens(PreparedDataset("data/corpus"), 0.05)
        train, held = data.tokens[:cut], data.tokens[cut:]
    """
    first = held_out_start(data.num_documents, eval_split, source=data.prefix)
    if first == data.num_documents:
        return data.num_tokens
    sequence = int(data.document_indices[first])
    return int(data.sequence_pointers[sequence]) // data.dtype.itemsize
