from array_api_compat import array_namespace

from baton.core import Callback, DriverView
from baton.core.abilities import Ability


class AttentionOutputRMS(Callback):
    """Log the RMS of every attention output projection's weights: rms/<name>."""

    def requires(self) -> frozenset[Ability]:
        return frozenset({"model_state"})  # checked before the first step

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        state = driver.backend.model_state()
        squares, sizes = {}, {}
        for piece in state.parameters("*.self_attn.o_proj.*"):
            xp = array_namespace(piece.value)  # torch or JAX: the same math
            if piece.counted:  # one holder per element: replicas count once
                squares[piece.name] = xp.sum(piece.value * piece.value)
            sizes[piece.name] = piece.size  # elements of the whole tensor
        totals = state.fetch(state.sum_over_ranks(squares))  # over every rank, one transfer
        for name, size in sizes.items():
            metrics[f"rms/{name}"] = (totals[name] / size) ** 0.5
