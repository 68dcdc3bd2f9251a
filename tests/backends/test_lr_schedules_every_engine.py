"""Every engine's own scheduler built from baton's schedule gives the same rate at every
step: Fabric's ``LambdaLR``, TorchTitan's ``LRSchedulersContainer`` and MaxText's optax
schedule (MaxText's in float32), for constant, linear and cosine after a warmup.
Megatron-Core's is ``megatron/test_megatron_schedule.py`` (bit for bit). The real-size
recipes (TorchTitan's and Megatron-Core's Llama 3 8B, MaxText's Llama 2 7B) build, from
their ``--lr-schedule``, ``--warmup-steps`` and ``--min-lr`` and their defaults, the
engine scheduler whose rates are core's ``resolve_schedule``'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from baton.core.cli.recipe import build_driver
from baton.core.lr_schedule import LRSchedule, resolve_schedule
from baton.core.objectives import objective_named

SHAPES = [LRSchedule(3e-3, 3e-4, warmup, 9, decay)
          for decay in ("constant", "linear", "cosine") for warmup in (0, 2)]  # fmt: skip


def expected(shape: LRSchedule) -> list[float]:
    return [shape.lr(k) for k in range(1, shape.total_steps + 3)]


def torch_rates(optimizer, scheduler, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.decay}-{s.warmup_steps}")
def test_fabric_lambda_lr(shape: LRSchedule) -> None:
    import torch

    from baton.backends.fabric.lr_schedule import lambda_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=shape.peak)
    scheduler = lambda_scheduler(shape)(optimizer)
    rates = torch_rates(optimizer, scheduler, shape.total_steps + 2)
    assert rates == pytest.approx(expected(shape), rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.decay}-{s.warmup_steps}")
def test_torchtitan_schedulers_container(shape: LRSchedule) -> None:
    import torch

    pytest.importorskip("torchtitan")
    from baton.backends.torchtitan.lr_schedule import schedule_config

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=shape.peak)
    container = schedule_config(shape).build(optimizers=[optimizer], training_steps=9)
    scheduler = container.schedulers[0]
    rates = torch_rates(optimizer, scheduler, shape.total_steps + 2)
    assert rates == pytest.approx(expected(shape), rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.decay}-{s.warmup_steps}")
def test_maxtext_optax_schedule(shape: LRSchedule) -> None:
    pytest.importorskip("jax")
    import jax

    from baton.backends.maxtext.lr_schedule import optax_schedule

    schedule = jax.jit(optax_schedule(shape))
    rates = [float(schedule(count)) for count in range(shape.total_steps + 2)]
    assert rates == pytest.approx(expected(shape), rel=1e-6)  # float32


# -- the real-size recipes: their flags give the same schedule -------------------------

RECIPES = Path(__file__).parents[2] / "recipes"
#: (flags, the schedule core resolves from them): the defaults, and each flag given
FROM_FLAGS = [
    ([], {}),
    (["--lr-schedule", "linear", "--warmup-steps", "2", "--min-lr", "1e-4"],
     {"lr_schedule": "linear", "warmup_steps": 2, "min_lr": 1e-4}),
    (["--lr-schedule", "constant", "--warmup-steps", "3"],
     {"lr_schedule": "constant", "warmup_steps": 3}),
]  # fmt: skip
RUN = ["--max-steps", "9", "--lr", "2e-3"]


def core_schedule(asked: dict[str, Any]) -> LRSchedule:
    """What ``resolve_schedule`` makes of ``RUN`` and ``asked`` for pretraining."""
    return resolve_schedule(objective_named("pretrain"), lr=2e-3, max_steps=9, **asked)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    from baton.data import train_tokenizer

    return str(train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=300).path)


@pytest.mark.parametrize(("flags", "asked"), FROM_FLAGS, ids=["defaults", "linear", "constant"])
def test_torchtitan_8b_recipe_builds_core_s_schedule(
    flags: list[str], asked: dict[str, Any], tokenizer: str, tmp_path: Path
) -> None:
    """TorchTitan's scheduler, built from the 8B recipe's config as its trainer builds
    it, gives core's rate at every step."""
    import torch

    pytest.importorskip("torchtitan")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "a document"}) + "\n")
    driver = build_driver(RECIPES / "torchtitan_llama3_8b.py", [
        *RUN, *flags, "--data-path", str(corpus), "--tokenizer", tokenizer,
        "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    assert driver is not None
    config, shape = driver.backend.config, core_schedule(asked)
    lr = config.optimizer.param_groups[0].optimizer_kwargs["lr"]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    container = config.lr_scheduler.build(
        optimizers=[optimizer], training_steps=config.training.steps
    )
    rates = torch_rates(optimizer, container.schedulers[0], shape.total_steps + 2)
    assert rates == pytest.approx(expected(shape), rel=1e-12)
    assert driver.options.settings["lr_schedule"] == shape.decay


@pytest.mark.parametrize(("flags", "asked"), FROM_FLAGS, ids=["defaults", "linear", "constant"])
def test_megatron_8b_recipe_builds_core_s_schedule(
    flags: list[str], asked: dict[str, Any], tokenizer: str, tmp_path: Path
) -> None:
    """Megatron-Core's ``OptimizerParamScheduler``, built from the 8B recipe's config as
    the backend builds it, gives core's rate at every step, bit for bit."""
    import torch

    pytest.importorskip("megatron.core")
    from baton.backends.megatron.build import param_scheduler

    driver = build_driver(RECIPES / "megatron_llama3_8b.py", [
        *RUN, *flags, "--data-path", str(tmp_path / "corpus"), "--tokenizer", tokenizer,
        "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    assert driver is not None
    shape = core_schedule(asked)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    scheduler = param_scheduler(driver.backend.config, optimizer)
    rates = []
    for _ in range(shape.total_steps + 2):
        rates.append(optimizer.param_groups[0]["lr"])
        scheduler.step(increment=1)
    assert rates == expected(shape)
    assert driver.options.settings["lr_schedule"] == shape.decay


#: builds the 7B recipe from each command line and prints MaxText's rates (MaxText's
#: config sets JAX's settings process-wide: a process of its own)
MAXTEXT_RATES = """
import json, sys
from baton.backends.maxtext.lr_schedule import baton_schedule
from baton.core.cli.recipe import build_driver

recipe, data, tokenizer, runs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
out = []
for argv in runs:
    driver = build_driver(recipe, [*argv, "--data-path", data, "--tokenizer", tokenizer])
    config = driver.backend.config
    import jax
    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils

    cfg = pyconfig.initialize(config.argv({"skip_jax_distributed_system": True}))
    with baton_schedule(config.warmup_steps, config.lr_schedule):  # as the backend's setup
        schedule = jax.jit(maxtext_utils.create_learning_rate_schedule(cfg))
    steps = int(cfg.learning_rate_schedule_steps) + 2
    rates = [float(schedule(count)) for count in range(steps)]
    out.append({"rates": rates, "lr_schedule": driver.options.settings["lr_schedule"]})
print(json.dumps(out))
"""


def test_maxtext_7b_recipe_builds_core_s_schedule(tokenizer: str, tmp_path: Path) -> None:
    """MaxText's optax schedule, built from the 7B recipe's resolved config as the
    backend's setup builds it, gives core's rate at every step (in float32)."""
    pytest.importorskip("maxtext")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "a document"}) + "\n")
    runs = [[*RUN, *flags] for flags, _ in FROM_FLAGS]
    env = os.environ | {"JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", MAXTEXT_RATES, str(RECIPES / "maxtext_llama2_7b.py"),
         str(corpus), tokenizer, json.dumps(runs)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for (_, asked), result in zip(FROM_FLAGS, results, strict=True):
        shape = core_schedule(asked)
        assert result["rates"] == pytest.approx(expected(shape), rel=1e-6)
        assert result["lr_schedule"] == shape.decay
