"""The ``--reference`` setting, shared by the objectives that compare the policy with a
reference model (DPO, GRPO with a KL term).

Example::

    Objective(..., settings=(..., REFERENCE), changeable=frozenset({"reference"}))
"""

from __future__ import annotations

from baton.core.objectives.declaration import Setting

REFERENCE = Setting(
    "reference",
    str,
    None,
    "the reference model: a Hugging Face directory or checkpoint (None: the starting weights)",
    optional=True,
    not_called=("ref_model", "reference_model"),
)
