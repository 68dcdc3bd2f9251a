"""The JAX backend drives the user's own flax model and optax optimizer: bit-for-bit
parity with a hand-written ``jax.jit`` + optax loop, metrics, evaluation, epochs, and
clear errors on bad input."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from backends.jax.tiny import batches, loss_fn, make_model

from baton.backends.jax import BatchRejected, DataUnavailable, JaxBackend, LossFunctionError
from baton.core import Callback, Driver


class Record(Callback):
    """Keeps every logged loss and metric, and the backend's final train state."""

    def __init__(self) -> None:
        self.logs: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []
        self.params = None

    def on_log(self, driver, metrics):
        if "loss" in metrics:
            self.logs.append(dict(metrics))

    def on_eval_end(self, driver, metrics):
        self.evals.append(dict(metrics))

    def on_train_end(self, driver):
        import jax

        self.params = jax.device_get(driver.backend.state["params"])


def handwritten(data, steps, lr=1e-2):
    """The loop a JAX user writes by hand for an nnx model: split, ``jax.jit`` with the
    state donated, merge, ``nnx.value_and_grad`` (the dropout's RNG counter advances
    inside the loss), optax update, split again."""
    import jax
    import optax
    from flax import nnx

    graphdef, params, rest = nnx.split(make_model(0), nnx.Param, ...)
    tx = optax.adam(lr)
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(params, rest, opt_state, batch):
        model = nnx.merge(graphdef, params, rest)
        loss, grads = nnx.value_and_grad(lambda m: loss_fn(m, batch))(model)
        updates, opt_state = tx.update(grads, opt_state, params)
        rest = nnx.split(model, nnx.Param, ...)[2]
        return optax.apply_updates(params, updates), rest, opt_state, loss

    losses = []
    for batch in data[:steps]:
        params, rest, opt_state, loss = step(params, rest, opt_state, batch)
        losses.append(float(loss))
    return losses, jax.device_get(params)


def test_parity_with_handwritten_jit_optax_loop(tmp_path):
    import jax
    import optax

    data = batches(12)
    record = Record()
    backend = JaxBackend(
        model=lambda: make_model(0),
        optimizer=optax.adam(1e-2),
        loss_fn=loss_fn,
        train_data=data,
        eval_data=batches(2, seed=9),
        lr_schedule=lambda count: 1e-2,
    )
    result = Driver(
        backend, [record], max_steps=12, log_every=1, eval_every=6, run_dir=tmp_path
    ).fit()
    expected, expected_params = handwritten(data, 12)
    assert [m["loss"] for m in record.logs] == expected  # bit for bit, every step
    assert jax.tree.all(jax.tree.map(np.array_equal, record.params, expected_params)), (
        "final parameters differ from the hand-written loop's"
    )
    assert expected[-1] < expected[0] - 0.5  # it really trains
    # tokens and samples are counted from the batch; the schedule is read out as lr
    assert result.tokens == 12 * 8 * 16 and result.samples == 12 * 8
    assert record.logs[0]["lr"] == pytest.approx(1e-2)
    assert [sorted(e) for e in record.evals] == [["eval/loss"], ["eval/loss"]]
    assert record.evals[1]["eval/loss"] < record.evals[0]["eval/loss"]


def test_linen_model_and_metrics_from_the_loss_function(tmp_path):
    import jax
    import optax
    from flax import linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(256)(nn.relu(nn.Dense(64)(nn.Embed(256, 32)(x))))

    def loss_with_metrics(model, batch):
        logits = model(batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        return loss, {"accuracy": (logits.argmax(-1) == batch["y"]).mean()}

    data = batches(8)
    module = MLP()
    variables = module.init(jax.random.key(0), data[0]["x"])
    record = Record()
    Driver(
        JaxBackend(
            model=module,
            variables=variables,
            optimizer=optax.adam(1e-2),
            loss_fn=loss_with_metrics,
            train_data=data,
            count_batch=lambda b: (b["x"].size, len(b["x"])),
        ),
        [record],
        max_steps=8,
        log_every=4,
        run_dir=tmp_path,
    ).fit()
    assert [sorted(k for k in m if k in ("loss", "accuracy")) for m in record.logs] == [
        ["accuracy", "loss"]
    ] * 2
    assert record.logs[1]["loss"] < record.logs[0]["loss"]


def test_epochs_restart_or_stop_as_configured(tmp_path):
    import optax

    def build(on_data_end, data):
        return JaxBackend(
            model=lambda: make_model(0),
            optimizer=optax.sgd(0.1),
            loss_fn=loss_fn,
            train_data=data,
            on_data_end=on_data_end,
        )

    data = batches(3)
    backend = build("restart", data)
    assert Driver(backend, max_steps=7, run_dir=tmp_path / "a").fit().step == 7
    assert (backend.data.epoch, backend.data.batches_read) == (2, 1)
    backend.skip_data(3)  # what a guard does to step over a bad window: one batch per step
    assert (backend.data.epoch, backend.data.batches_read) == (3, 1)

    # on_data_end="stop": the run ends in order at the last complete step
    stopped = Driver(build("stop", data), max_steps=7, run_dir=tmp_path / "b").fit()
    assert stopped.step == 3 and "ran out after 3 batches of epoch 0" in stopped.stop_reason
    # a one-shot generator cannot start a second epoch: a clear error, no hang
    with pytest.raises(DataUnavailable, match="one-shot iterator.*factory"):
        Driver(build("restart", iter(data)), max_steps=7, run_dir=tmp_path / "c").fit()
    with pytest.raises(DataUnavailable, match="no batches"):
        Driver(build("restart", lambda: []), max_steps=2, run_dir=tmp_path / "d").fit()


def test_bad_input_gives_clear_errors(tmp_path):
    import optax

    def run(loss=loss_fn, data=None, steps=1):
        backend = JaxBackend(
            model=lambda: make_model(0),
            optimizer=optax.sgd(0.1),
            loss_fn=loss,
            train_data=data or batches(2),
        )
        Driver(backend, max_steps=steps, run_dir=tmp_path).fit()

    def per_token(model, batch):  # forgot the .mean()
        import optax

        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])

    with pytest.raises(LossFunctionError, match=r"scalar floating loss.*shape \(8, 16\)"):
        run(per_token)
    with pytest.raises(LossFunctionError, match="tuple of 3"):
        run(lambda m, b: (loss_fn(m, b), {}, 1))
    # a batch the model cannot take (a float image instead of token ids): named with shapes
    images = [{"x": np.zeros((8, 4, 4), np.float32), "y": np.zeros((8,), np.int32)}]
    with pytest.raises(BatchRejected, match=r"rejected training batch .*float32\[8, 4, 4\]"):
        run(data=images)
    with pytest.raises(ValueError, match="needs optimizer"):
        JaxBackend(model=make_model, loss_fn=loss_fn, train_data=[]).setup()
    with pytest.raises(TypeError, match="optax.GradientTransformation"):
        JaxBackend(model=make_model, optimizer="adam", loss_fn=loss_fn, train_data=[]).setup()
    with pytest.raises(TypeError, match="JaxConfig has no field 'lr'"):
        JaxBackend(lr=1e-3)


def test_readme_bring_your_own_jax_model_example_runs(tmp_path, monkeypatch, capsys):
    from baton.core.cli.recipe import build_driver
    from support.docs_examples import docs_example

    code = docs_example("jax-bring-your-own")
    assert len([line for line in code.splitlines() if line.strip()]) < 25
    recipe = tmp_path / "my_jax.py"
    recipe.write_text(code)
    monkeypatch.chdir(tmp_path)
    record = Record()
    driver = build_driver(recipe, ["--max-steps", "100"])
    driver.callbacks.append(record)
    driver.options = driver.options.replace(log_every=5)
    result = driver.fit()
    assert result.step == 100
    assert record.logs[-1]["loss"] < 0.5 * record.logs[0]["loss"]
    assert (tmp_path / "runs" / "my_jax" / "checkpoints" / "step_000100" / "baton.json").is_file()
    assert "step    100 | loss " in capsys.readouterr().out  # the standard console line


TWO_DEVICES = """
import json, sys
sys.path.insert(0, {tests!r})
import optax
from baton.backends.jax import JaxBackend
from baton.core import Driver
from backends.jax.test_jax_backend import Record, handwritten
from backends.jax.tiny import batches, loss_fn, make_model

data = batches(6)
record = Record()
backend = JaxBackend(model=lambda: make_model(0), optimizer=optax.adam(1e-2), loss_fn=loss_fn,
                     train_data=data)
Driver(backend, [record], max_steps=6, log_every=1, run_dir={run_dir!r}).fit()
print(json.dumps({{"mesh": dict(backend.mesh.shape), "losses": [m["loss"] for m in record.logs],
                   "expected": handwritten(data, 6)[0]}}))
"""


@pytest.mark.slow
def test_several_devices_split_the_batch_over_a_data_mesh(tmp_path):
    """Two CPU devices in one process: a ``data`` mesh, each device half of every batch,
    the same losses as one device (up to the order of the gradient sum)."""
    import json
    import os
    import subprocess
    import sys

    tests = str(Path(__file__).resolve().parents[2])
    script = TWO_DEVICES.format(tests=tests, run_dir=str(tmp_path / "run"))
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["mesh"] == {"data": 2}
    assert report["losses"] == pytest.approx(report["expected"], rel=1e-5)


def test_rollback_and_preemption_with_standard_callbacks(tmp_path):
    """A rollback to an orbax checkpoint mid-run replays the same losses (state and data
    position come back); SIGUSR1 through ``Preemption`` saves and stops cleanly.

    Saves are synchronous here: ``Driver.load_checkpoint`` reads the checkpoint's
    metadata before it waits for saves in flight (async resume is tested in a fresh
    process in ``test_jax_resume.py``)."""
    import os
    import signal

    import optax

    from baton.callbacks import Checkpoint, Preemption

    class RollbackThenSignal(Callback):
        def __init__(self) -> None:
            self.losses: list[tuple[int, float]] = []
            self.rolled_back = False

        def on_step_start(self, driver):
            if driver.step == 8 and not self.rolled_back:
                self.rolled_back = True
                driver.load_checkpoint(driver.checkpoint_dir / "step_000004")

        def on_log(self, driver, metrics):
            if "loss" in metrics:
                self.losses.append((driver.step, metrics["loss"]))
            if driver.step == 10:
                os.kill(os.getpid(), signal.SIGUSR1)

    probe = RollbackThenSignal()
    backend = JaxBackend(
        model=lambda: make_model(0),
        optimizer=optax.adam(1e-2),
        loss_fn=loss_fn,
        train_data=lambda: iter(batches(30)),
    )
    callbacks = [Checkpoint(every_n_steps=4), Preemption(["SIGUSR1"]), probe]
    result = Driver(backend, callbacks, max_steps=30, log_every=1, run_dir=tmp_path).fit()
    steps = [s for s, _ in probe.losses]
    assert steps == [*range(1, 9), *range(5, 12)]
    first, replay = dict(probe.losses[:8]), dict(probe.losses[8:12])
    assert replay == {s: first[s] for s in range(5, 9)}  # bit for bit after the rollback
    assert result.step == 11 and "SIGUSR1" in result.stop_reason
    assert (tmp_path / "checkpoints" / "step_000011" / "backend" / "state").is_dir()
