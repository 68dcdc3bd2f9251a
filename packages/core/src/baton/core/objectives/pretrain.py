"""Pretraining: the mean negative log-likelihood of every next token of the text.

Every engine runs its own cross entropy over its own data pipeline (windows of tokenized
text); the declaration is what the command line, the data checks and the tools read.

Example::

    run = ObjectiveRun.of("pretrain")
    run.objective.data          # DataKind.TEXT
    run.objective.lr_schedule   # "cosine": decayed to a floor unless --lr-schedule says
"""

from __future__ import annotations

from baton.core.objectives.declaration import DataKind, Objective
from baton.core.objectives.sft import negative_log_likelihood, supervised_tokens

PRETRAIN = Objective(
    name="pretrain",
    summary="the mean negative log-likelihood of every next token of the text",
    data=DataKind.TEXT,
    loss=negative_log_likelihood,
    items=supervised_tokens,
    item_name="tokens",
    native_cross_entropy=True,
    lr_schedule="cosine",
)
