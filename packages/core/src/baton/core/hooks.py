"""The frozen set of events a callback can handle, in the order a run meets them.

Entry hooks run in ascending ``priority`` (then list order); exit hooks run in the
reverse order so that whatever a callback set up on the way in is unwound last-in
first-out on the way out.
"""

from __future__ import annotations

HOOKS: tuple[str, ...] = (
    "on_configure",
    "on_setup",
    "on_load_checkpoint",
    "on_train_start",
    "on_step_start",
    "on_rollout_end",
    "on_step_end",
    "on_log",
    "on_eval_start",
    "on_eval_end",
    "on_save_checkpoint",
    "on_checkpoint_saved",
    "on_checkpoint_removed",
    "on_train_end",
    "on_exception",
    "on_teardown",
)

EXIT_HOOKS: frozenset[str] = frozenset({"on_train_end", "on_exception", "on_teardown"})
