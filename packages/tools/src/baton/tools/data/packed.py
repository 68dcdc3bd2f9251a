"""The post-training writer, :func:`baton.data.packed.write_packed` (numpy only; kept
importable from here too).

Example::

    from baton.tools.data.packed import write_packed   # same as baton.data.packed's
"""

from baton.data.packed import write_packed

__all__ = ["write_packed"]
