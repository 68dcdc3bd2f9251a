"""docs/ARCHITECTURE.md against the code: the claims a test can check.

- its abilities table lists exactly the abilities of ``baton.core.backend.ABILITY_HINTS``;
- every file or folder it links to exists;
- it names every module of ``baton.core`` and every module and folder of
  ``baton.backends`` (a new one gets a line there, a removed one loses it).
"""

from __future__ import annotations

import re
from pathlib import Path

from baton.core.backend import ABILITY_HINTS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
CORE = ROOT / "packages" / "core" / "src" / "baton" / "core"
BACKENDS = ROOT / "packages" / "backends" / "src" / "baton" / "backends"


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _table_after(heading_text: str, text: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after ``heading_text``."""
    rest = text[text.index(heading_text) :]
    lines = rest.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:  # past the header and its rule
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_abilities_table_lists_every_ability():
    rows = _table_after("| ability | protocol | who needs it |", _text())
    named = {m.group(1) for row in rows if (m := re.fullmatch(r"`(\w+)`", row[0]))}
    assert named == set(ABILITY_HINTS), (
        f"docs/ARCHITECTURE.md's abilities table lists {sorted(named)}; "
        f"ABILITY_HINTS has {sorted(ABILITY_HINTS)}"
    )


def test_every_link_points_at_a_file_that_exists():
    targets = re.findall(r"\]\((\.\./[^)#]+)\)", _text())
    assert targets, "no relative links found: did the link syntax change?"
    missing = sorted({t for t in targets if not (DOC.parent / t).exists()})
    assert not missing, f"docs/ARCHITECTURE.md links to paths that do not exist: {missing}"


def test_every_core_and_backends_module_is_named():
    text = _text()
    entries = [p for p in CORE.glob("*.py") if p.name != "__init__.py"]
    entries += [p for p in BACKENDS.glob("*.py") if p.name != "__init__.py"]
    entries += [p for p in BACKENDS.iterdir() if p.is_dir() and p.name != "__pycache__"]
    unnamed = sorted(
        str(p.relative_to(ROOT))
        for p in entries
        if f"`{p.name}`" not in text and f"`{p.name}/`" not in text
    )
    assert not unnamed, f"docs/ARCHITECTURE.md does not mention: {unnamed}"
