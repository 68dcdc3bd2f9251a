"""The code examples of the documentation, read where a user reads them.

A runnable example is marked in a page (``docs/*.md`` or ``README.md``) by a comment
line before its code block, ``<!-- docs-example: NAME -->``; a test fetches it by name::

    code = docs_example("bring-your-own")   # the Python block after the marker
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- docs-example: ([a-z0-9-]+) -->\s*```python\n(.*?)```", re.S)


def pages() -> list[Path]:
    """Every documentation page: the README and the site's pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def docs_examples() -> dict[str, tuple[Path, str]]:
    """Every marked example: name -> (page, code)."""
    found: dict[str, tuple[Path, str]] = {}
    for page in pages():
        for name, code in MARKER.findall(page.read_text()):
            assert name not in found, f"docs example {name!r} is marked twice"
            found[name] = (page, code)
    return found


def docs_example(name: str) -> str:
    """The code of the example marked ``name``."""
    return docs_examples()[name][1]
