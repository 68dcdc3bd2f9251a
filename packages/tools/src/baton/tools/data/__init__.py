"""``baton data``: tokenizers and prepared datasets (see :mod:`baton.tools.data.cli`).

* ``baton data tokenizer``: train a byte-level BPE offline (:func:`~baton.data.train_tokenizer`)
* ``baton data prepare``: local text -> ``PREFIX.bin``/``.idx``/``.json`` (:func:`prepare`)
* ``baton data inspect``: counts, manifest, first documents decoded (:func:`describe`)

The datasets are read back with :class:`baton.data.PreparedDataset`.
"""

from baton.tools.data.cli import main

__all__ = ["main"]
