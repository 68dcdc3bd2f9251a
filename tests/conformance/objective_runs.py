"""Short runs of one objective on one backend, as a user starts them: the conformance
suite's tiny build of the backend for pretraining text (``factories.build``), and for a
post-training objective the command line ``baton compare`` gives the backend's recipe
(``baton.tools.compare.backend_command``: the shared flags, the objective's settings, the
recipe's own flags from its descriptor's ``CompareRun``), built by ``build_driver``.

    files = objective_files(grpo_assets["files"], tmp_path)   # chat, pairs, prompts
    logged = objective_run("megatron", "dpo", tmp_path / "run", files)
    logged.metrics[1]["loss"], logged.metrics[1]["rewards/margins"]

The data an objective reads picks the assets (``Objective.data``), so an objective a
package registers that reads conversations, pairs or prompts runs here too:

- text: the backend's conformance build (its recipe's own tiny data);
- conversations: ``support.posttrain.sft_prefix`` rows of ``SEQ_LEN`` inputs;
- preference pairs: ``support.posttrain.preference_prefix``, with the reference model
  (``--reference``, a tiny model of another seed) where the objective takes one;
- prompts: the GRPO fixtures (``support.grpo``): the prepared prompts, the fixed rollouts
  replayed by ``--generator recorded:FILE`` and scored by their recorded rewards, every
  rollout in one step, trained for ``STEPS`` iterations, with a KL term (``--beta``) so
  every declared metric is computed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from baton.core import Driver
from baton.core.objectives import DataKind, Objective, objective_named
from conformance.factories import RECIPES, build
from support.grpo import GENERATIONS, MAX_COMPLETION, PROMPTS, TEMPERATURE
from support.posttrain import LoggedMetrics, preference_prefix, sft_prefix, tiny_model

#: optimizer steps of every run
STEPS = 2
#: inputs a packed row of conversations or pairs holds, and rows a step
SEQ_LEN, BATCH = 96, 2
#: rows of a GRPO step hold the fixtures' longest prompt and completion
GRPO_SEQ_LEN, MAX_PROMPT = 40, 24
#: the fixtures' GRPO settings, by the declaration's names (those an objective reading
#: prompts declares are given to it)
GRPO_SETTINGS: dict[str, Any] = {
    "num_generations": GENERATIONS,
    "max_prompt_length": MAX_PROMPT,
    "max_completion_length": MAX_COMPLETION,
    "temperature": TEMPERATURE,
    "top_k": 0,
    "beta": 0.04,
    "num_iterations": STEPS,
}
REWARDS = Path(__file__).parents[1] / "support" / "grpo_rewards.py"


def objective_files(grpo_files: dict[str, Path], root: Path) -> dict[str, Path]:
    """``grpo_files`` (tokenizer, policy, prepared prompts, rollouts) with packed
    conversations (``sft``) and pairs (``pairs``) made with its tokenizer, and a
    ``reference`` model, under ``root``."""
    tokenizer = grpo_files["tokenizer"]
    return {
        **grpo_files,
        "sft": sft_prefix(root, tokenizer, SEQ_LEN),
        "pairs": preference_prefix(root, tokenizer, SEQ_LEN),
        "reference": tiny_model(root / "reference", seed=1),
    }


def declared_keys(objective: Objective) -> tuple[str, ...]:
    """The keys a step of ``objective`` logs: the loss, its metrics, the step's own
    (a rollout's) and the console's."""
    return tuple(
        dict.fromkeys(
            ("loss", *objective.metrics, *objective.step_metrics, *objective.console_keys)
        )
    )


def objective_run(backend: str, objective: str, run_dir: Path, files: dict[str, Path]) -> Any:
    """``STEPS`` steps of ``objective`` on ``backend`` under ``run_dir``; every logged
    step's metrics (``LoggedMetrics``)."""
    logged = LoggedMetrics()
    declared = objective_named(objective)
    if declared.data == DataKind.TEXT and objective == "pretrain":
        engine = build(backend, run_dir)
        Driver(engine, [logged], max_steps=STEPS, log_every=1, run_dir=run_dir).fit()
        return logged
    from baton.core.cli.recipe import build_driver

    command = posttrain_command(backend, declared, run_dir, files)
    driver = build_driver(Path(command[0]), command[1:])
    assert driver is not None
    driver.callbacks.append(logged)
    driver.fit()
    return logged


def posttrain_command(
    backend: str, objective: Objective, run_dir: Path, files: dict[str, Path]
) -> list[str]:
    """The recipe and flags ``baton compare`` would run ``objective`` on ``backend`` with,
    on the fixtures' data for the objective's kind."""
    from baton.tools.compare import backend_command, compared, setting_flags

    if backend not in compared():
        pytest.fail(
            f"backend {backend!r} declares {objective.name!r} but no CompareRun: declare how "
            "its recipe runs (BackendDescriptor.compare) so the suite can run the objective"
        )
    own = {s.name for s in objective.settings}
    values: dict[str, Any] = {}
    seq_len, batch = SEQ_LEN, BATCH
    if objective.data == DataKind.CONVERSATIONS:
        data = files["sft"]
    elif objective.data == DataKind.PAIRS:
        data = files["pairs"]
        values["reference"] = str(files["reference"])
    elif objective.data == DataKind.PROMPTS:
        data, seq_len, batch = files["prepared"], GRPO_SEQ_LEN, PROMPTS * GENERATIONS
        rollouts = files["rollouts"]
        values |= GRPO_SETTINGS | {
            "generator": f"recorded:{rollouts}",
            "reward": (f"{REWARDS}:recorded:path={rollouts}",),
        }
    else:
        pytest.fail(
            f"objective {objective.name!r} reads {objective.data.described}, which the suite "
            "has no fixture for: add one to tests/conformance/objective_runs.py"
        )
    command = backend_command(
        backend,
        run_dir,
        init_from=str(files["policy"]),
        data_path=str(data),
        tokenizer=str(files["tokenizer"]),
        steps=STEPS,
        seq_len=seq_len,
        batch=batch,
        lr=1e-3,
        recipes=RECIPES,
        objective=objective.name,
        lr_schedule="constant",
        objective_flags=setting_flags(
            objective.name, {k: v for k, v in values.items() if k in own}
        ),
    )
    return command[4:]  # python -m baton.core.cli.command run RECIPE FLAGS...
