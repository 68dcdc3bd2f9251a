"""The JAX backend's model_state and the callbacks on it: gradient norms before clipping
against ``jax.grad``, the update-to-weight ratio, freezing (bitwise, with resume), a
learning rate set by a callback, and the EMA (against the test's own average, resumed
bit for bit, used for evaluation)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from baton.backends.jax import JaxBackend
from baton.backends.jax.model_state import named_leaves
from baton.callbacks import EMA, Freeze, GradientNormMonitor, WeightMonitor
from baton.core import Callback, Driver
from baton.core.errors import UsageError
from support.jax_llama import next_token_loss, tiny_llama_nnx, token_batches


class Weights(Callback):
    """Host copies of every parameter after each step (and before the first), the
    logged metrics, and the gradients the backend showed."""

    def __init__(self) -> None:
        self.after: dict[int, dict[str, np.ndarray]] = {}
        self.logs: dict[int, dict[str, float]] = {}
        self.evals: dict[int, dict[str, float]] = {}
        self.final: dict[str, np.ndarray] = {}

    def on_train_start(self, driver):
        self.after[driver.step] = self.host(driver)

    def on_step_end(self, driver, output):
        self.after[driver.step] = self.host(driver)

    def on_log(self, driver, metrics):
        self.logs[driver.step] = dict(metrics)

    def on_eval_end(self, driver, metrics):
        self.evals[driver.step] = dict(metrics)

    def on_train_end(self, driver):
        self.final = self.host(driver)

    @staticmethod
    def host(driver):
        return {p.name: np.array(p.value) for p in driver.backend.model_state().parameters()}


def backend(optimizer, *, steps=6, lr_schedule=None, eval_data=None):
    return JaxBackend(
        model=lambda: tiny_llama_nnx(0),
        optimizer=optimizer,
        loss_fn=next_token_loss,
        train_data=token_batches(steps),
        eval_data=eval_data,
        lr_schedule=lr_schedule,
    )


def expected_group_norms() -> dict[str, float]:
    """``grad_norm/<group>`` at depth 2 of step 1, from ``jax.grad`` on the same model."""
    import jax
    from flax import nnx

    graphdef, params, rest = nnx.split(tiny_llama_nnx(0), nnx.Param, ...)
    batch = token_batches(2)[0]
    grads = jax.grad(lambda p: next_token_loss(nnx.merge(graphdef, p, rest), batch))(params)
    squares: dict[str, float] = {}
    for name, grad in named_leaves(grads):
        group = f"grad_norm/{'.'.join(name.split('.')[:2])}"
        squares[group] = squares.get(group, 0.0) + float(np.sum(np.asarray(grad, np.float64) ** 2))
    norms = {group: math.sqrt(square) for group, square in squares.items()}
    return norms | {"grad_norm/total": math.sqrt(sum(squares.values()))}


def test_gradient_norms_before_clipping_and_update_ratios(tmp_path):
    import optax

    weights = Weights()
    tx = optax.chain(optax.clip_by_global_norm(1e-4), optax.sgd(0.1))  # clips every step
    Driver(backend(tx, steps=2), [GradientNormMonitor(depth=2), WeightMonitor(depth=2), weights],
           max_steps=2, log_every=1, run_dir=tmp_path).fit()  # fmt: skip
    expected = expected_group_norms()
    logged = {k: v for k, v in weights.logs[1].items() if k.startswith("grad_norm/")}
    assert logged == pytest.approx(expected, rel=1e-4)
    assert logged["grad_norm/total"] > 1e-2  # far above the clip: seen before clipping
    for step in (1, 2):
        before, after = weights.after[step - 1], weights.after[step]
        layer = [n for n in after if n.startswith("layers.1.")]
        norm = math.sqrt(sum(np.sum(after[n].astype(np.float64) ** 2) for n in layer))
        moved = math.sqrt(
            sum(np.sum((after[n] - before[n]).astype(np.float64) ** 2) for n in layer)
        )
        assert weights.logs[step]["weight_norm/layers.1"] == pytest.approx(norm, rel=1e-5)
        assert weights.logs[step]["update_ratio/layers.1"] == pytest.approx(moved / norm, rel=1e-3)


FROZEN = ["embed_tokens.*", "layers.0.*"]


def test_freeze_keeps_weights_and_optimizer_bitwise_and_resumes_inside_the_window(tmp_path):
    import optax

    from baton.callbacks import Checkpoint

    class AdamMoments(Callback):
        """Adam's first moments by name after step 3 (the last frozen step)."""

        def on_step_end(self, driver, output):
            if driver.step == 3:
                adam = driver.backend.state["opt_state"][0]
                self.mu = {n: np.array(v) for n, v in named_leaves(adam.mu)}

    def run(run_dir, resume="none"):
        weights, moments = Weights(), AdamMoments()
        callbacks = [Freeze(FROZEN, until_step=3), Checkpoint(every_n_steps=2, keep_last=None)]
        Driver(backend(optax.adam(1e-2)), [*callbacks, weights, moments], max_steps=5,
               log_every=1, run_dir=run_dir, resume=resume).fit()  # fmt: skip
        return weights, moments

    whole, moments = run(tmp_path / "whole")
    frozen = [n for n in whole.after[0] if n.startswith(("embed_tokens.", "layers.0."))]
    trained = [n for n in whole.after[0] if n not in frozen]
    assert frozen and trained
    for step in (1, 2, 3):
        for name in frozen:
            assert np.array_equal(whole.after[step][name], whole.after[0][name]), (step, name)
        for name in trained:
            assert not np.array_equal(whole.after[step][name], whole.after[step - 1][name])
    assert all(not moments.mu[n].any() for n in frozen)  # no optimizer-state change
    assert all(moments.mu[n].any() for n in trained)
    for name in frozen:  # step 4 trains them again
        assert not np.array_equal(whole.after[4][name], whole.after[3][name])
    assert whole.logs[3]["freeze/frozen"] == len(frozen) and whole.logs[4]["freeze/frozen"] == 0
    # a run resumed at step 2, inside the window, keeps it and ends bitwise where the
    # whole run did
    resumed, _ = run(tmp_path / "resumed", tmp_path / "whole/checkpoints/step_000002")
    assert min(resumed.after) == 2
    for step in (3, 4, 5):
        for name in whole.after[step]:
            assert np.array_equal(resumed.after[step][name], whole.after[step][name]), (step, name)
    with pytest.raises(UsageError, match="'nothing.*' matches no parameter.*layers"):
        Driver(
            backend(optax.sgd(0.1)), [Freeze("nothing.*")], max_steps=1, run_dir=tmp_path / "bad"
        ).fit()


class SetLr(Callback):
    def __init__(self, before_step: int, lr: float) -> None:
        self.before_step, self.lr = before_step, lr
        self.groups = None

    def on_step_start(self, driver):
        if driver.step + 1 == self.before_step:
            state = driver.backend.model_state()
            state.set_hyperparameter("lr", self.lr)
            self.groups = state.optimizer_groups()


def test_a_learning_rate_set_by_a_callback_is_the_next_update_s_and_the_schedule_continues(
    tmp_path,
):
    import optax

    schedule = optax.linear_schedule(0.1, 0.0, 10)  # 0.1, 0.09, 0.08, ...
    weights, set_lr = Weights(), SetLr(before_step=3, lr=0.04)
    watched: dict[int, dict[str, np.ndarray]] = {}

    class Grads(Callback):
        def on_setup(self, driver):
            driver.backend.model_state().watch_gradients(
                lambda g: watched.__setitem__(
                    driver.step + 1, {k: np.array(v) for k, v in g.items()}
                )
            )

    Driver(backend(optax.sgd(schedule), steps=4, lr_schedule=schedule), [Grads(), set_lr, weights],
           max_steps=4, log_every=1, run_dir=tmp_path).fit()  # fmt: skip
    assert set_lr.groups[0].lr == pytest.approx(0.04)
    # step 3 used 0.04 (the schedule's 0.08 halved), step 4 the schedule's 0.07 halved
    for step, lr in ((2, 0.09), (3, 0.04), (4, 0.035)):
        assert weights.logs[step]["lr"] == pytest.approx(lr, rel=1e-6)
        for name, grad in watched[step].items():
            change = weights.after[step][name] - weights.after[step - 1][name]
            np.testing.assert_allclose(change, -lr * grad, rtol=1e-4, atol=1e-7)


def test_ema_matches_the_average_of_each_step_s_weights_resumes_bitwise_and_evaluates(tmp_path):
    import jax
    import optax
    from flax import nnx

    from baton.callbacks import Checkpoint

    def run(run_dir, **driver):
        weights, ema = Weights(), EMA(decay=0.8, use_for_eval=True)
        b = backend(optax.adam(1e-2), eval_data=token_batches(1, seed=5))
        callbacks = [ema, Checkpoint(every_n_steps=2, keep_last=None), weights]
        Driver(b, callbacks, max_steps=4, log_every=1, eval_every=4, run_dir=run_dir,
               **driver).fit()  # fmt: skip
        return weights, {k: np.array(v) for k, v in ema.averages.items()}

    weights, averages = run(tmp_path / "whole")
    expected = {n: w.astype(np.float64) for n, w in weights.after[1].items()}
    for step in (2, 3, 4):
        expected = {n: 0.8 * expected[n] + 0.2 * weights.after[step][n] for n in expected}
    for name, value in averages.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-7)
    assert (tmp_path / "whole/checkpoints/step_000002/ema/arrays-rank0.safetensors").is_file()
    # evaluation at step 4 with the averages swapped in; the trained weights come back
    graphdef, params, rest = nnx.split(tiny_llama_nnx(0), nnx.Param, ...)
    names = [n for n, _ in named_leaves(params)]
    params = jax.tree.unflatten(jax.tree.structure(params), [averages[n] for n in names])
    loss = next_token_loss(nnx.merge(graphdef, params, rest), token_batches(1, seed=5)[0])
    assert weights.evals[4]["eval/loss"] == pytest.approx(float(loss), rel=1e-5)
    for name, value in weights.final.items():
        assert np.array_equal(value, weights.after[4][name]), name
    _, resumed = run(tmp_path / "resumed", resume=tmp_path / "whole/checkpoints/step_000002")
    for name, value in averages.items():
        assert np.array_equal(resumed[name], value), name


TWO_DEVICES = """
import json, sys
sys.path.insert(0, {tests!r})
import optax
from baton.backends.jax import JaxBackend
from baton.callbacks import Freeze, GradientNormMonitor
from baton.core import Callback, Driver
from support.jax_llama import next_token_loss, tiny_llama_nnx, token_batches

class Logged(Callback):
    def on_log(self, driver, metrics):
        self.metrics = dict(metrics)
        pieces = driver.backend.model_state().parameters("layers.0.*")
        self.frozen = all(p.frozen for p in pieces)

logged = Logged()
backend = JaxBackend(model=lambda: tiny_llama_nnx(0), optimizer=optax.adam(1e-2),
                     loss_fn=next_token_loss, train_data=token_batches(2))
Driver(backend, [GradientNormMonitor(depth=2), Freeze("layers.0.*"), logged], max_steps=1,
       log_every=1, run_dir={run_dir!r}).fit()
print(json.dumps({{"mesh": dict(backend.mesh.shape), "metrics": logged.metrics,
                  "frozen": logged.frozen}}))
"""


def test_two_devices_show_the_same_gradient_norms_and_freeze(tmp_path):
    """A ``data`` mesh over two CPU devices: the global gradients, the same norms as one
    device's ``jax.grad`` (frozen layer 0 left out)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[2])
    script = TWO_DEVICES.format(tests=tests, run_dir=str(tmp_path / "run"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["mesh"] == {"data": 2} and report["frozen"]
    expected = expected_group_norms()
    expected.pop("grad_norm/layers.0")
    expected["grad_norm/total"] = math.sqrt(
        sum(v**2 for k, v in expected.items() if k != "grad_norm/total")
    )
    logged = {k: v for k, v in report["metrics"].items() if k.startswith("grad_norm/")}
    assert logged == pytest.approx(expected, rel=1e-4)
