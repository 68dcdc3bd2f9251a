import torch
from torch import nn
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from baton.backends.fabric import FabricBackend, FabricConfig
from baton.callbacks import Checkpoint, CompositeLogger
from baton.core import Driver


def recipe(max_steps: int = 8, run_dir: str = "runs/two") -> Driver:
    """Two CPU processes that Lightning Fabric starts itself (devices=2, no torchrun)."""
    torch.manual_seed(0)
    x = torch.linspace(-3, 3, 256).unsqueeze(1)
    data = TensorDataset(x, torch.sin(x))
    backend = FabricBackend(
        model=nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1)),
        optimizer=lambda model: torch.optim.SGD(model.parameters(), lr=0.1),
        data=StatefulDataLoader(data, batch_size=16, shuffle=False),
        loss_fn=lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1]),
        config=FabricConfig(accelerator="cpu", devices=2, strategy="ddp", on_epoch_end="continue"),
    )
    return Driver(
        backend,
        [Checkpoint(every_n_steps=4), CompositeLogger(["jsonl"])],
        max_steps=max_steps,
        log_every=2,
        run_dir=run_dir,
    )
