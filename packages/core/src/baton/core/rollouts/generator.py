"""The generator seam: what samples completions for online RL, behind one small
interface.

A generator takes prompt ids and sampling settings and returns completions with the
log-probability of each sampled token; it holds the policy's weights, loaded in memory
by their Hugging Face names (the names ``model_state`` and ``baton export`` use) and
tagged with a version (optimizer steps done), so it loads them only when they changed.
Its sampler's random state is its own and travels in the checkpoint.

``baton.backends.rollouts.hf_generator.TransformersGenerator`` implements it with a
``transformers`` model on the training hosts. Another engine implements the same five
members and nothing else changes: a vLLM generator on a GPU loads the gathered tensors
into its engine (``load_weights``), samples with its own sampler at the same settings
(``generate``, with ``logprobs`` of the raw logits divided by the temperature) and saves
its seed and sampler state (``state_dict``); the engines never see which one runs.

Example::

    from baton.core.rollouts.generator import Sampling

    sampling = Sampling(temperature=1.0, top_p=1.0, top_k=0, max_tokens=64,
                        stop_ids=(2,), pad_id=0)
    generator.load_weights(named_tensors, version=0)      # HF names, whole tensors
    completions = generator.generate([[5, 6, 7], [5, 8]], sampling)
    completions[0].ids, completions[0].logps, completions[0].truncated
    state = generator.state_dict()                        # its sampler's random state
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from baton.core.errors import UsageError


@dataclass(frozen=True)
class Sampling:
    """How completions are sampled (TRL's GRPO settings, ``transformers``' meanings).

    ``temperature`` divides the logits; ``top_p`` (1.0: off) keeps the smallest set of
    tokens whose probability reaches it; ``top_k`` (0: off) keeps the ``k`` most likely;
    ``max_tokens`` bounds a completion's length (``--max-completion-length``);
    ``stop_ids`` end a completion (the stop token is part of it); ``pad_id`` fills the
    prompts' left padding.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 512
    stop_ids: tuple[int, ...] = ()
    pad_id: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise UsageError(
                f"--temperature must be above 0, not {self.temperature}; pass e.g. 1.0"
            )
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1], not {self.top_p}; 1.0 turns it off")
        if self.top_k < 0:
            raise UsageError(f"--top-k must be 0 (off) or positive, not {self.top_k}")
        if self.max_tokens < 1:
            raise UsageError(f"--max-completion-length must be at least 1, not {self.max_tokens}")


@dataclass(frozen=True)
class Completion:
    """One sampled completion.

    ``ids`` are the sampled tokens, the stop token included when one was sampled;
    ``logps[i]`` is the log-softmax of the raw logits divided by the temperature at
    ``ids[i]`` (the quantity the engines' loss computes for the same token), and
    ``truncated`` says that no stop token came within ``max_tokens``.
    """

    ids: list[int]
    logps: list[float]
    truncated: bool

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logps):
            raise ValueError(
                f"a completion of {len(self.ids)} tokens has {len(self.logps)} log-probabilities"
            )


class Generator(Protocol):
    """Samples completions with the policy's current weights (see the module's text)."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling) -> list[Completion]:
        """One completion per prompt, in order, sampled with ``sampling`` from the
        generator's own random state."""
        ...

    def load_weights(self, weights: Mapping[str, Any], version: int) -> None:
        """Load whole tensors by Hugging Face name (every name of the model, none
        other); nothing is loaded when ``version`` is the one held."""
        ...

    @property
    def version(self) -> int | None:
        """The version of the weights held (``None``: none loaded yet)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The sampler's random state (values: JSON data or NumPy arrays)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        ...
