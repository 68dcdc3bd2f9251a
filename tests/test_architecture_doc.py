"""docs/ARCHITECTURE.md against the code: the claims a test can check.

- its abilities table lists exactly the abilities of ``baton.core.backend.ABILITY_HINTS``;
- no table lists a row twice (the same first cell);
- every file or folder it links to exists, and so does every module it names by path
  (`` `lightning/loop.py` ``, `` `driver.py` ``);
- it names every module of ``baton.core`` and every module and folder of
  ``baton.backends`` (a new one gets a line there, a removed one loses it).
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

from baton.core.abilities import ABILITY_HINTS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
CORE = ROOT / "packages" / "core" / "src" / "baton" / "core"
BACKENDS = ROOT / "packages" / "backends" / "src" / "baton" / "backends"


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


#: modules the page names as absent (baton is a namespace package)
ABSENT = {"baton/__init__.py"}


def _tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of ``text``: its rows (cells) past the header and its rule."""
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


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
    rows = _table_after("| ability | the methods it promises | who needs it |", _text())
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


def test_no_table_lists_a_row_twice():
    tables = _tables(_text())
    assert len(tables) >= 3, "fewer tables than the page has: did the table syntax change?"
    twice = [
        (table[0][0], first)
        for table in tables
        for first, count in Counter(row[0] for row in table).items()
        if count > 1
    ]
    assert not twice, f"docs/ARCHITECTURE.md lists these rows twice (table, row): {twice}"


def test_every_module_named_by_path_exists():
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    named = set(re.findall(r"`([\w./-]+\.py)`", _text())) - ABSENT
    assert len(named) > 50, "few module names found: did the page's code spans change?"
    missing = sorted(n for n in named if not any(f == n or f.endswith(f"/{n}") for f in tracked))
    assert not missing, f"docs/ARCHITECTURE.md names modules that do not exist: {missing}"
