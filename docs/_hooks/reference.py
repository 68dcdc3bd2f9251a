"""mkdocs hook: generated reference tables and links into the code.

- ``<!-- reference: NAME -->`` in a page becomes the table ``baton.tools.reference``
  builds from the code (callbacks, abilities, metric keys, patches, the flag vocabulary).
- A link to a file outside ``docs/`` (``../packages/core/src/baton/core/driver.py``) works
  when the markdown is read in the repository; on the site it becomes the file's path in
  code style, since the site carries no source files.
"""

from __future__ import annotations

import re
from typing import Any

from baton.tools.reference import fill

_OUTSIDE_LINK = re.compile(r"\[([^\]]+)\]\((?:\.\./)+([^)#\s]+)(#[^)]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = fill(markdown)

    def as_path(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if target.startswith("docs/"):
            return match.group(0)
        return text if text.startswith("`") else f"{text} (`{target}`)"

    return _OUTSIDE_LINK.sub(as_path, markdown)
