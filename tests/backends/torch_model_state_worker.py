"""Run under torchrun with 2 processes: the shared torch ``ModelState`` over FSDP 2
(``fully_shard`` on a 2-rank CPU mesh, gloo) and over FSDP 1 with ``use_orig_params``
(Fabric's entries: flat runs). Writes ``rank<r>.json`` into OUT."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

from baton.backends import torch_distributed
from baton.backends.fabric.model_state import fabric_entries
from baton.backends.torch_model_state import TorchModelState
from baton.backends.torch_pieces import entries_from_parameters


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _loss(model: nn.Module) -> torch.Tensor:
    return model(torch.linspace(-1, 1, 12).reshape(3, 4)).square().mean()


def _train(model: nn.Module, state: TorchModelState) -> tuple[dict[str, float], bool]:
    """Two steps with layer 0 frozen (is it bitwise unchanged?), then the squared
    gradient norms of a third, per name, summed over ranks from the counted pieces."""
    (optimizer,) = state.optimizers
    squares: dict[str, torch.Tensor] = {}
    counted = {p.name: p.counted for p in state.parameters()}

    def watch(grads):
        for name, grad in grads.items():
            if counted[name]:
                squares[name] = grad.square().sum()

    state.watch_gradients(watch)
    state.freeze("0.*")
    frozen = state.parameters("0.weight")[0].value.clone()
    for _ in range(2):
        optimizer.zero_grad()
        _loss(model).backward()
        state.before_clipping()
        optimizer.step()
    unchanged = torch.equal(state.parameters("0.weight")[0].value, frozen)
    state.unfreeze("*")
    optimizer.zero_grad()
    _loss(model).backward()
    state.before_clipping()
    return state.fetch(state.sum_over_ranks(squares)), unchanged


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reference = _net()  # the same steps in one process: layer 0 frozen for two
    sgd = torch.optim.SGD(reference[2].parameters(), lr=0.1)
    for _ in range(2):
        sgd.zero_grad()
        _loss(reference).backward()
        sgd.step()
    reference.zero_grad()
    _loss(reference).backward()
    expected = {n: float(p.grad.square().sum()) for n, p in reference.named_parameters()}

    model = _net()
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    state = TorchModelState(
        entries_from_parameters(model.named_parameters()),
        optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)],
        fetch=torch_distributed.fetch,
    )
    summed, unchanged = _train(model, state)
    layout = {p.name: [p.global_shape, [[s.start, s.stop] for s in p.index], p.counted,
                       list(p.value.shape)] for p in state.parameters()}  # fmt: skip

    # arrays shaped like the pieces, saved per rank and read back in the same layout
    arrays = {p.name: p.value.double() * 2 for p in state.parameters()}
    state.save_arrays(out / "arrays", arrays)
    dist.barrier()
    loaded = state.load_arrays(out / "arrays")
    arrays_back = sorted(loaded) == sorted(arrays) and all(
        torch.equal(loaded[k], v) for k, v in arrays.items()
    )

    # FSDP 1 (Fabric's "fsdp" strategy, which Fabric runs on GPUs only): flat runs
    flat = _net()
    wrapped = FullyShardedDataParallel(flat, use_orig_params=True, device_id=torch.device("cpu"))
    flat_state = TorchModelState(
        fabric_entries(flat, wrapped, rank=rank),
        optimizers=[torch.optim.SGD(wrapped.parameters(), lr=0.1)],
        fetch=torch_distributed.fetch,
    )
    flat_summed, flat_unchanged = _train(wrapped, flat_state)
    flat_layout = {p.name: [p.global_shape, [[s.start, s.stop] for s in p.index]]
                   for p in flat_state.parameters()}  # fmt: skip
    # ranks pass different names: each missing one counts as zero there
    mixed = state.fetch(state.sum_over_ranks({f"only{rank}": torch.tensor(rank + 1.0)}))
    result = {"layout": layout, "summed": summed, "expected": expected,
              "unchanged": unchanged, "mixed": mixed, "flat_layout": flat_layout,
              "flat_summed": flat_summed, "flat_unchanged": flat_unchanged,
              "arrays_back": arrays_back}  # fmt: skip
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
