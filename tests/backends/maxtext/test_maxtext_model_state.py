"""MaxText's ``model_state``: Hugging Face names over scanned layers, gradients before
clipping equal to ``transformers``' autograd, freezing that keeps weights and Adam moments
bitwise, a learning rate set from a callback, writes and arrays beside a checkpoint.

One MaxText model (fp32, started from a tiny Hugging Face Llama with ``--init-from``) is
built once for the module and driven step by step; the scenario runs once and the tests
read its record."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("maxtext")

import torch
from backends.maxtext.maxtext_support import outside_driver

from baton.core.cli.recipe import build_driver
from support.tiny_llama import load_llama, save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "maxtext_tiny.py"
SEQ, BATCH = 64, 2
FROZEN = ["model.layers.0.*", "model.embed_tokens.weight"]


def _host(values: dict[str, Any]) -> dict[str, np.ndarray]:
    import jax

    return {name: np.array(jax.device_get(v)) for name, v in values.items()}


def _moments(backend: Any, layer: int) -> dict[str, np.ndarray]:
    """Adam's first and second moments of the query kernel, at one layer of the stack."""
    adam = backend.state["optimizer"].to_pure_dict()["opt_state"][0]
    kernel = ("decoder", "layers", "self_attention", "query", "kernel")
    found = {}
    for moment in ("mu", "nu"):
        node = adam[moment]
        for key in kernel:
            node = node[key]
        found[moment] = np.array(node[:, layer])
    return found


def _kernel(tree: Any) -> np.ndarray:
    """The gate projections of every layer (the array the update checks read)."""
    return np.array(tree["decoder"]["layers"]["mlp"]["wi_0"]["kernel"])


def _adam_step(backend: Any, before: np.ndarray) -> dict[str, Any]:
    """The gate kernels before and after one step, with Adam's moments after it."""
    adam = backend.state["optimizer"].to_pure_dict()["opt_state"][0]
    return {
        "before": before,
        "after": _kernel(backend.state["model"].to_pure_dict()),
        "mu": _kernel(adam["mu"]),
        "nu": _kernel(adam["nu"]),
        "count": int(adam["count"]),
    }


def _learning_rate_used(cfg: Any, step: dict[str, Any], weight_decay: float) -> float:
    """AdamW's update from the moments it kept is ``-lr * (mu_hat / (sqrt(nu_hat) + eps)
    + weight_decay * p)``: the ``lr`` that fits the change (least squares)."""
    count = step["count"]
    mu_hat = step["mu"] / (1 - cfg.adam_b1**count)
    nu_hat = step["nu"] / (1 - cfg.adam_b2**count)
    direction = mu_hat / (np.sqrt(nu_hat + cfg.adam_eps_root) + cfg.adam_eps)
    direction = direction + weight_decay * step["before"]
    change = step["after"] - step["before"]
    return -float(np.vdot(change, direction) / np.vdot(direction, direction))


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Four steps unwatched, then again from the same weights and batches watched; then
    freezing, unfreezing and a learning rate set; every observation recorded."""
    import jax
    import jax.numpy as jnp

    root = tmp_path_factory.mktemp("model_state")
    hf_dir = save_tiny_llama(root / "hf", vocab_size=512, initializer_range=0.3)
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--batch-size", str(BATCH),
        "--seq-len", str(SEQ), "--max-steps", "40", "--run-dir", str(root / "run"),
        "--overrides", "dtype=float32", f"base_output_directory={root / 'out'}",
    ])  # fmt: skip
    backend = driver.backend
    record: dict[str, Any] = {"hf_dir": hf_dir}
    with outside_driver():
        backend.setup()
        start, data = jax.tree.map(jnp.copy, backend.state), backend.batches.state_dict()
        record["batch"] = next(backend.batches)  # the first batch, for transformers
        backend.batches.load_state_dict(data)

        def steps(first: int, count: int) -> list[dict[str, float]]:
            outputs = [backend.train_step(step) for step in range(first, first + count)]
            return [backend.fetch({"loss": o.loss, **o.metrics}) for o in outputs]

        record["plain"] = steps(1, 4)
        backend.state = start
        backend.batches.load_state_dict(data)
        state = backend.model_state()
        record["initial"] = _host({p.name: p.value for p in state.parameters()})
        record["pieces"] = state.parameters()
        shown: list[dict[str, Any]] = []
        state.watch_gradients(lambda grads: shown.append(_host(grads)))
        record["watched"] = steps(1, 4)
        record["first_gradients"] = shown[0]

        before = _host({p.name: p.value for p in state.parameters()})
        moments = (_moments(backend, 0), _moments(backend, 1))
        record["frozen_names"] = state.freeze(FROZEN)
        record["frozen_flags"] = {p.name: p.frozen for p in state.parameters()}
        steps(5, 3)
        record["while_frozen"] = (before, _host({p.name: p.value for p in state.parameters()}))
        record["moments"] = (moments, (_moments(backend, 0), _moments(backend, 1)))
        record["shown_while_frozen"] = set(shown[-1])
        state.unfreeze("*")
        thawed = _host({p.name: p.value for p in state.parameters(FROZEN)})
        steps(8, 1)
        record["unfrozen"] = (thawed, _host({p.name: p.value for p in state.parameters(FROZEN)}))

        schedule = backend.learning_rate_schedule
        record["schedule"] = [float(schedule(i)) for i in (8, 9, 10)]
        state.set_hyperparameter("lr", 2e-3)
        record["groups"] = state.optimizer_groups()
        before = _kernel(backend.state["model"].to_pure_dict())
        record["lr_steps"] = steps(9, 1)
        record["lr_update"] = _adam_step(backend, before)
        record["lr_steps"] += steps(10, 1)
        record["hparams"] = backend.hparams
        (root / "checkpoint").mkdir()  # the driver makes the step directory
        backend.save(root / "checkpoint")
        state.set_hyperparameter("lr", 1e-5)
        backend.load(root / "checkpoint")
        record["resumed_groups"] = state.optimizer_groups()
        state.set_hyperparameter("weight_decay", 0.5)
        before = _kernel(backend.state["model"].to_pure_dict())
        steps(11, 1)
        record["decay_update"] = _adam_step(backend, before)
        record["decay_groups"] = state.optimizer_groups()

        norm = "model.norm.weight"
        state.assign({norm: jnp.full((64,), 0.5, jnp.float32)})
        record["assigned"] = np.array(state.parameters(norm)[0].value)
        state.save_arrays(root / "arrays", {p.name: p.value for p in state.parameters()})
        record["saved"] = _host({p.name: p.value for p in state.parameters()})
        record["loaded"] = _host(state.load_arrays(root / "arrays"))
        backend.teardown()
    return record


def _hf_gradients(hf_dir: Path, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    model = load_llama(hf_dir)
    tokens, targets = (torch.from_numpy(batch[k]).long() for k in ("inputs", "targets"))
    logits = model(tokens).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def test_pieces_are_the_hugging_face_tensors_with_their_stacked_array(scenario):
    from safetensors.numpy import load_file

    hf = load_file(str(scenario["hf_dir"] / "model.safetensors"))
    assert set(scenario["initial"]) == set(hf)
    for name, value in scenario["initial"].items():
        np.testing.assert_allclose(value, hf[name], rtol=1e-6, atol=1e-6, err_msg=name)
    pieces = {p.name: p for p in scenario["pieces"]}
    query = pieces["model.layers.1.self_attn.q_proj.weight"]
    assert query.fused == "decoder.layers.self_attention.query.kernel"
    assert query.global_shape == (64, 64) and query.index == (slice(0, 64), slice(0, 64))
    assert query.counted and pieces["model.norm.weight"].fused is None


def test_gradients_before_clipping_equal_transformers_per_parameter(scenario):
    expected = _hf_gradients(scenario["hf_dir"], scenario["batch"])
    shown = scenario["first_gradients"]
    assert set(shown) == set(expected)
    for name, grad in expected.items():
        got = float(np.linalg.norm(shown[name]))
        assert got == pytest.approx(float(grad.norm()), rel=1e-4), name
    total = math.sqrt(sum(float(g.norm()) ** 2 for g in expected.values()))
    assert total > 1.5  # above the clipping threshold (1.0): these are the raw gradients


def test_losses_are_bitwise_maxtexts_while_gradients_are_watched(scenario):
    plain, watched = scenario["plain"], scenario["watched"]
    assert [s["loss"] for s in watched] == [s["loss"] for s in plain]
    assert [s["grad_norm"] for s in watched] == [s["grad_norm"] for s in plain]
    for ours, theirs in zip(watched, plain, strict=True):  # MaxText's clipped norm, kept
        assert ours["grad_norm_clipped"] == pytest.approx(theirs["grad_norm_clipped"], rel=1e-6)


def test_frozen_parameters_and_their_moments_stay_bitwise_then_train_again(scenario):
    before, after = scenario["while_frozen"]
    frozen = set(scenario["frozen_names"])
    assert "model.layers.0.mlp.up_proj.weight" in frozen and len(frozen) == 10
    assert {n for n, flag in scenario["frozen_flags"].items() if flag} == frozen
    for name in before:
        unchanged = np.array_equal(before[name], after[name])
        assert unchanged == (name in frozen), name
    (layer0, layer1), (layer0_after, layer1_after) = scenario["moments"]
    for moment in ("mu", "nu"):
        assert np.array_equal(layer0[moment], layer0_after[moment])
        assert not np.array_equal(layer1[moment], layer1_after[moment])
    assert scenario["shown_while_frozen"].isdisjoint(frozen)
    thawed, trained = scenario["unfrozen"]
    assert all(not np.array_equal(thawed[n], trained[n]) for n in thawed)


def test_a_learning_rate_set_is_the_one_the_next_update_used(scenario):
    cfg = scenario["hparams"]
    (group,) = scenario["groups"]
    assert group.lr == pytest.approx(2e-3, rel=1e-6)
    assert group.weight_decay == pytest.approx(cfg.adam_weight_decay)
    first, second = scenario["lr_steps"]
    assert first["lr"] == pytest.approx(2e-3, rel=1e-6)
    now, later, _ = scenario["schedule"]  # the schedule continues from the value set
    assert second["lr"] == pytest.approx(2e-3 * later / now, rel=1e-6)
    used = _learning_rate_used(cfg, scenario["lr_update"], cfg.adam_weight_decay)
    assert used == pytest.approx(2e-3, rel=1e-4)


def test_resume_keeps_the_learning_rate_set_and_weight_decay_changes(scenario):
    cfg = scenario["hparams"]
    at_set, _, at_resume = scenario["schedule"]
    expected = 2e-3 * at_resume / at_set  # the factor came back with the checkpoint
    (resumed,) = scenario["resumed_groups"]
    assert resumed.lr == pytest.approx(expected, rel=1e-6)
    (group,) = scenario["decay_groups"]
    assert group.weight_decay == 0.5
    assert _learning_rate_used(cfg, scenario["decay_update"], 0.5) == pytest.approx(
        expected, rel=1e-4
    )


def test_assign_writes_back_and_arrays_round_trip(scenario):
    np.testing.assert_array_equal(scenario["assigned"], np.full((64,), 0.5, np.float32))
    assert set(scenario["loaded"]) == set(scenario["saved"])
    for name, value in scenario["saved"].items():
        np.testing.assert_array_equal(scenario["loaded"][name], value)
