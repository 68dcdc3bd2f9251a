"""Reference tables of the documentation, generated from the code.

The documentation site (``mkdocs.yml``) replaces a marker such as
``<!-- reference: callbacks -->`` in a page with the table of that name, so the lists
of callbacks, abilities, metric keys and patches are read from the registries and
docstrings at build time and cannot drift from the code::

    from baton.tools.reference import render

    print(render("abilities"))   # | ability | protocol | what a backend provides |

``TABLES`` names every table; ``render`` raises ``KeyError`` for another name.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

from baton.core.registry import CALLBACKS


def _cell(text: str) -> str:
    """One line of markdown table cell text (pipes escaped, whitespace folded)."""
    return " ".join(text.split()).replace("|", "\\|")


def _doc_summary(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ")


def metric_keys_of(obj: object) -> str:
    """The ``Metric keys logged:`` sentence of a callback's module or class docstring."""
    module = inspect.getmodule(obj)
    for doc in (inspect.getdoc(obj), inspect.getdoc(module) if module else None):
        if not doc:
            continue
        found = re.search(r"Metric keys logged:(.*?)(?:\n\s*\n|$)", doc, re.S)
        if found:
            return found.group(1).strip()
    return ""


def _arguments(obj: object) -> str:
    """``name=default`` for each argument of a callback's constructor."""
    try:
        signature = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    parts = []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is parameter.empty:
            parts.append(f"`{parameter.name}`")
        else:
            parts.append(f"`{parameter.name}={parameter.default!r}`")
    return ", ".join(parts) or "none"


def callbacks_table() -> str:
    """Every registered callback: its name (``--callback NAME``), class, what it does,
    its arguments and the metric keys it logs."""
    rows = ["| name | class | what it does | arguments | metric keys |", "|---|---|---|---|---|"]
    for name, cls in CALLBACKS.items():
        rows.append(
            f"| `{name}` | `{cls.__module__}.{cls.__qualname__}` | {_cell(_doc_summary(cls))} "
            f"| {_cell(_arguments(cls))} | {_cell(metric_keys_of(cls)) or 'none'} |"
        )
    return "\n".join(rows)


def abilities_table() -> str:
    """The optional abilities of the backend contract (``baton.core.backend``)."""
    from baton.core.abilities import ABILITY_HINTS

    rows = ["| ability | what a backend provides |", "|---|---|"]
    rows += [f"| `{name}` | {_cell(hint)} |" for name, hint in ABILITY_HINTS.items()]
    return "\n".join(rows)


def metrics_table() -> str:
    """The metric keys every backend logs with one meaning (``STANDARD_METRICS``)."""
    from baton.core.metrics import STANDARD_METRICS

    rows = ["| key | meaning | logged by |", "|---|---|---|"]
    rows += [
        f"| `{key}` | {_cell(meaning)} | {_cell(source)} |"
        for key, (meaning, source) in STANDARD_METRICS.items()
    ]
    return "\n".join(rows)


def callback_metrics_table() -> str:
    """The metric keys each registered callback adds."""
    rows = ["| callback | metric keys |", "|---|---|"]
    for name, cls in CALLBACKS.items():
        keys = metric_keys_of(cls)
        if keys and not keys.lower().startswith("none"):
            rows.append(f"| `{name}` | {_cell(keys)} |")
    return "\n".join(rows)


def patches_table() -> str:
    """Every registered patch: backend, versions, phase and what it fixes."""
    from baton.core.patches import PATCHES

    rows = ["| patch | backend | versions | phase | what it fixes |", "|---|---|---|---|---|"]
    for _, cls in sorted(PATCHES.items(), key=lambda item: (item[1].backend, item[0])):
        rows.append(
            f"| `{cls.name}` | `{cls.backend}` | {cls.versions or 'any'} | {cls.phase} "
            f"| {_cell(cls.summary())} |"
        )
    return "\n".join(rows)


def vocabulary_table() -> str:
    """The flags every recipe uses with one meaning (``baton.core.cli.vocabulary``)."""
    from baton.core.cli.vocabulary import markdown_table

    return markdown_table()


def objectives_table() -> str:
    """Every registered objective: what it minimises, the data it reads, its reference
    model, the metric keys its loss logs, its settings and its default learning-rate
    schedule (``baton.core.objectives``)."""
    from baton.core.objectives import OBJECTIVES, ReferenceUse

    rows = [
        "| objective | what a step minimises | data | reference | metric keys | settings "
        "| `--lr-schedule` |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in OBJECTIVES.names():
        objective = OBJECTIVES.get(name)
        if isinstance(objective.reference, ReferenceUse):
            reference = objective.reference.value
        else:
            reference = "per rollout with a KL term" if objective.rollouts else "by setting"
        keys = ", ".join(f"`{k}`" for k in (*objective.metrics, *objective.step_metrics))
        flags = ", ".join(f"`{s.flag}`" for s in objective.settings)
        rows.append(
            f"| `{name}` | {_cell(objective.summary)} | {objective.data.described} "
            f"| {reference} | {keys or 'none'} | {flags or 'none'} | `{objective.lr_schedule}` |"
        )
    return "\n".join(rows)


def objective_settings_table(name: str) -> str:
    """One objective's settings: flag, type, default and meaning (its declaration)."""
    from baton.core.objectives import objective_named

    rows = ["| flag | type | default | meaning |", "|---|---|---|---|"]
    for setting in objective_named(name).settings:
        kind = setting.type.__name__ + (" (repeatable)" if setting.repeatable else "")
        kind += " (several)" if setting.listed else ""
        rows.append(
            f"| `{setting.flag}` | {kind} | `{setting.default!r}` | {_cell(setting.help)} |"
        )
    return "\n".join(rows)


#: the tables a page may ask for with ``<!-- reference: NAME -->`` (and
#: ``objective-NAME``: that objective's settings)
TABLES: dict[str, Callable[[], str]] = {
    "callbacks": callbacks_table,
    "abilities": abilities_table,
    "metrics": metrics_table,
    "callback-metrics": callback_metrics_table,
    "patches": patches_table,
    "vocabulary": vocabulary_table,
    "objectives": objectives_table,
}
#: the prefix of an objective's settings table (``objective-grpo``)
OBJECTIVE_TABLE = "objective-"

MARKER = re.compile(r"<!-- reference: ([a-z-]+) -->")


def render(name: str) -> str:
    """The markdown table called ``name`` (one of ``TABLES``, or ``objective-NAME``)."""
    if name.startswith(OBJECTIVE_TABLE) and name not in TABLES:
        return objective_settings_table(name[len(OBJECTIVE_TABLE) :])
    return TABLES[name]()


def fill(markdown: str) -> str:
    """Replace every ``<!-- reference: NAME -->`` marker in ``markdown`` with its table;
    an unknown name raises ``KeyError`` listing the known ones."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES and not name.startswith(OBJECTIVE_TABLE):
            raise KeyError(f"unknown reference table {name!r}; known: {', '.join(TABLES)}")
        return render(name)

    return MARKER.sub(table, markdown)
