"""The shared torch ``ModelState`` on a real torch model and optimizer (one process;
the DTensor layouts under 2 ranks run in ``torch_model_state_worker.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from baton.backends import torch_distributed
from baton.backends.torch_model_state import TorchModelState
from baton.backends.torch_pieces import Entry, entries_from_parameters, strip_wrappers
from baton.core.model_state import ModelState

HERE = Path(__file__).parent


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _state(model: nn.Module, optimizer: torch.optim.Optimizer, schedulers=()) -> TorchModelState:
    return TorchModelState(
        entries_from_parameters(model.named_parameters()),
        optimizers=[optimizer],
        schedulers=list(schedulers),
        fetch=torch_distributed.fetch,
    )


def _step(model, optimizer, state, schedulers=(), clip=None):
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    optimizer.zero_grad()
    model(x).square().mean().backward()
    state.before_clipping()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    for scheduler in schedulers:
        scheduler.step()


def test_pieces_are_views_with_layout_and_assign_writes_them():
    model = _net()
    state = _state(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(state, ModelState)
    pieces = state.parameters("0.*")
    assert [p.name for p in pieces] == ["0.weight", "0.bias"]
    weight = pieces[0]
    assert weight.global_shape == (8, 4) and weight.index == (slice(0, 8), slice(0, 4))
    assert weight.counted and not weight.frozen and weight.size == 32
    weight.value.mul_(0)  # a view: reaches the model
    assert torch.count_nonzero(model[0].weight) == 0
    state.assign({"2.bias": torch.tensor([1.5, -2.0])})
    assert model[2].bias.tolist() == [1.5, -2.0]
    with pytest.raises(ValueError, match=r"2.bias is \(2,\) on this rank"):
        state.assign({"2.bias": torch.zeros(3)})
    with pytest.raises(KeyError, match="no parameters named"):
        state.assign({"nope": torch.zeros(3)})


def test_gradients_before_clipping_and_freeze_keeps_weights_and_optimizer_state():
    model = _net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    state = _state(model, optimizer)
    seen: list[dict[str, torch.Tensor]] = []
    state.watch_gradients(lambda grads: seen.append({k: v.clone() for k, v in grads.items()}))
    _step(model, optimizer, state, clip=1e-3)  # clipping after the watchers: unclipped
    assert set(seen[0]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    unclipped = torch.stack([g.norm() for g in seen[0].values()]).norm()
    assert unclipped > 1e-2  # the clip at 1e-3 came after

    assert state.freeze("0.*") == ["0.weight", "0.bias"]
    assert [p.frozen for p in state.parameters()] == [True, True, False, False]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = optimizer.state[model[0].weight]["exp_avg"].clone()
    for _ in range(3):
        _step(model, optimizer, state)
    assert set(seen[-1]) == {"2.weight", "2.bias"}  # frozen ones not shown
    assert torch.equal(model[0].weight, before["0.weight"])
    assert torch.equal(model[0].bias, before["0.bias"])
    assert torch.equal(optimizer.state[model[0].weight]["exp_avg"], moments)
    assert not torch.equal(model[2].weight, before["2.weight"])

    assert state.unfreeze("0.weight") == ["0.weight"]
    _step(model, optimizer, state)
    assert not torch.equal(model[0].weight, before["0.weight"])
    assert torch.equal(model[0].bias, before["0.bias"])


def test_fused_parts_freeze_together():
    model = nn.Linear(4, 6)
    fused = "qkv.weight"
    parts = [
        Entry(
            f"{name}.weight",
            model.weight,
            (2, 4),
            (slice(0, 2), slice(0, 4)),
            fused=fused,
            view=lambda t, i=i: t[2 * i : 2 * i + 2],
        )
        for i, name in enumerate(["q", "k", "v"])
    ]
    state = TorchModelState(parts, fetch=torch_distributed.fetch)
    with pytest.raises(ValueError, match=r"q.weight alone.*qkv.weight.*\['k.weight', 'v.weight'\]"):
        state.freeze("q.*")
    assert state.freeze(["q.*", "k.*", "v.*"]) == ["q.weight", "k.weight", "v.weight"]
    k = state.parameters("k.weight")[0].value
    assert k.data_ptr() == model.weight[2:4].data_ptr()


def test_set_lr_is_the_next_update_and_the_schedule_continues_scaled():
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    state = _state(model, optimizer, [scheduler])
    _step(model, optimizer, state, [scheduler])
    assert state.optimizer_groups()[0].lr == pytest.approx(0.05)
    state.set_hyperparameter("lr", 0.02)
    assert state.optimizer_groups()[0].lr == 0.02
    grads: list[torch.Tensor] = []
    state.watch_gradients(lambda g: grads.append(g["2.bias"].clone()))
    before = model[2].bias.detach().clone()
    _step(model, optimizer, state, [scheduler])
    used = (before - model[2].bias.detach()) / grads[0]
    torch.testing.assert_close(used, torch.full_like(used, 0.02), rtol=1e-5, atol=0)
    # the schedule continues from 0.02 with its own shape: 0.02 * (1/3) / (1/2)
    assert state.optimizer_groups()[0].lr == pytest.approx(0.02 * 2 / 3)
    state.set_hyperparameter("weight_decay", 0.3, groups=[0])
    assert state.optimizer_groups()[0].weight_decay == 0.3
    assert state.optimizer_groups()[0].names == ("0.weight", "0.bias", "2.weight", "2.bias")
    with pytest.raises(IndexError, match="no optimizer group 1"):
        state.set_hyperparameter("lr", 0.1, groups=[1])


def test_sums_fetch_and_arrays_round_trip(tmp_path: Path):
    model = _net()
    state = _state(model, torch.optim.SGD(model.parameters(), lr=0.1))
    sums = state.sum_over_ranks({"a": torch.tensor(2.0), "b": torch.tensor(3.0)})
    assert state.fetch(sums) == {"a": 2.0, "b": 3.0}
    averaged = {p.name: p.value.double() * 2 for p in state.parameters("2.*")}
    state.save_arrays(tmp_path / "ema", averaged)
    loaded = state.load_arrays(tmp_path / "ema")
    assert set(loaded) == {"2.weight", "2.bias"}
    assert all(torch.equal(loaded[k], averaged[k]) for k in averaged)
    other = TorchModelState(
        [Entry("2.bias", model[2].bias, (4,), (slice(2, 4),))], fetch=torch_distributed.fetch
    )
    with pytest.raises(ValueError, match=r"2.bias was saved in another layout.*\[2, 4\]"):
        other.load_arrays(tmp_path / "ema")


def test_wrapper_prefixes_are_stripped():
    assert strip_wrappers("_orig_mod.net.0._fsdp_wrapped_module.weight") == "net.0.weight"
    assert strip_wrappers("module.net.module.weight") == "module.net.module.weight"


def test_fsdp2_and_fsdp1_layouts_gradient_sums_and_freeze_on_two_ranks(tmp_path: Path):
    import json

    from support.torchrun import torchrun

    torchrun(HERE / "torch_model_state_worker.py", str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, facts in enumerate(ranks):
        # fully_shard splits dim 0: rank r holds rows [4r, 4r+4) of the (8, 4) weight
        shape, index, counted, local = facts["layout"]["0.weight"]
        assert (shape, index, counted, local) == (
            [8, 4],
            [[4 * rank, 4 * rank + 4], [0, 4]],
            True,
            [4, 4],
        )
        assert facts["layout"]["2.bias"][1] == [[rank, rank + 1]]
        assert facts["unchanged"]
        assert facts["mixed"] == {"only0": 1.0, "only1": 2.0}
        for name, value in facts["expected"].items():
            assert facts["summed"][name] == pytest.approx(value, rel=1e-5), name
            assert facts["flat_summed"][name] == pytest.approx(value, rel=1e-5), name
        assert facts["flat_unchanged"]
    # one safetensors file per rank: its shard of each array, with where it sits
    from safetensors import safe_open

    for rank, facts in enumerate(ranks):
        assert facts["arrays_back"]
        with safe_open(str(tmp_path / "arrays" / f"arrays-rank{rank}.safetensors"), "pt") as f:
            where = json.loads(f.metadata()["baton.layout"])["0.weight"]
            assert where == {"global_shape": [8, 4], "index": [[4 * rank, 4 * rank + 4], [0, 4]]}
            assert f.get_tensor("0.weight").dtype == torch.float64
    # FSDP 1 flattens the 58 parameters' elements and gives each rank 29 of them
    flat = [facts["flat_layout"] for facts in ranks]
    assert flat[0]["0.weight"] == [[32], [[0, 29]]] and flat[1]["0.weight"] == [[32], [[29, 32]]]
    assert flat[0]["2.weight"] == [[16], [[0, 0]]] and flat[1]["2.weight"] == [[16], [[0, 16]]]
