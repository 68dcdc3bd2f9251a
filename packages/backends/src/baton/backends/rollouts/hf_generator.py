"""The ``transformers`` generator: samples completions with ``generate`` as TRL's
``GRPOTrainer`` does, holding the policy's weights loaded in memory by Hugging Face name.

``generate`` left-pads the prompts and calls ``model.generate(do_sample=True, ...)`` with
TRL's settings (temperature, top-p, top-k with 0 off, no min-p or repetition penalty,
``max_new_tokens``, the stop ids as ``eos_token_id``, the pad id); a completion ends at
its first stop token (kept) and is truncated when none came. The log-probability of each
sampled token is the log-softmax of the raw logits (``output_logits=True``) divided by
the temperature: the quantity the engines' loss computes, not that of the filtered
distribution the token was drawn from.

Sampling draws from the generator's own random state (seeded by ``seed``): it runs inside
``torch.random.fork_rng``, so the training's random state is never touched, and the state
travels in ``state_dict``. ``load_weights`` copies whole tensors by name into the model
(every name of the model, none other) and does nothing when the version is the one held.

Example::

    from baton.backends.rollouts.hf_generator import TransformersGenerator
    from baton.core.rollouts.generator import Sampling

    generator = TransformersGenerator("hf_models/policy", device="cpu", seed=0)
    generator.load_weights(policy_state_dict, version=0)
    completions = generator.generate([[5, 6, 7]] * 4, Sampling(max_tokens=32, stop_ids=(2,)))
    generator.state_dict()       # {"seed": 0, "cpu": uint8 array, ...}
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baton.core.errors import UsageError
from baton.core.rollouts.generator import Completion, Sampling

log = logging.getLogger("baton")

#: files whose presence says a model directory holds weights (not only a config)
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def holds_weights(directory: Path) -> bool:
    """Whether a Hugging Face model directory holds weights (not only a config)."""
    return any(p.suffix in WEIGHT_SUFFIXES for p in directory.iterdir())


def build_causal_lm(source: str | Path | Any, device: torch.device) -> Any:
    """A ``transformers`` causal LM in fp32, eval mode, no gradients: from a directory's
    weights where it holds some, else from its (or the given) config."""
    import transformers

    if isinstance(source, str | Path):
        directory = Path(source)
        if not (directory / "config.json").is_file():
            raise UsageError(
                f"{directory} holds no config.json; pass the policy's Hugging Face model "
                "directory (an export, or the --init-from directory)"
            )
        if holds_weights(directory):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                directory, dtype=torch.float32
            )
        else:
            config = transformers.AutoConfig.from_pretrained(directory)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_config(source, dtype=torch.float32)
    model = model.to(device).eval()
    model.requires_grad_(False)
    # the sampling settings are all given per call: none come from a saved generation config
    model.generation_config = transformers.GenerationConfig()
    return model


def left_padded(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of the prompts, left-padded to the longest."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise UsageError(f"prompt {row} holds no tokens; every prompt needs at least one")
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def _as_tensor(value: Any) -> torch.Tensor:
    """A whole tensor given as torch, NumPy or any array NumPy reads (a JAX array)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    array = np.asarray(value)
    if array.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: torch reads no such NumPy type
        array = array.astype(np.float32)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


class TransformersGenerator:
    """A ``transformers`` model sampling completions (the ``Generator`` protocol of
    ``baton.core.rollouts.generator``).

    Args:
        model: the policy's Hugging Face directory (its weights are read where it has
            them; the config alone otherwise) or a ``transformers`` config.
        device: where the model runs.
        seed: the sampler's seed.

    ``loads`` and ``skipped_loads`` count the weight loads done and skipped.
    """

    def __init__(
        self, model: str | Path | Any, *, device: str | torch.device = "cpu", seed: int = 0
    ):
        self.device = torch.device(device)
        self.seed = seed
        with self._forked_rng():  # a model built from its config draws its initial weights
            self.model = build_causal_lm(model, self.device)
        self._cpu_state, self._device_state = self._seeded_states(seed)
        self._version: int | None = None
        self._names = self._weight_names()
        self.loads = 0
        self.skipped_loads = 0

    # -- the sampler's random state --------------------------------------------------
    @property
    def _on_accelerator(self) -> bool:
        return self.device.type != "cpu"

    def _seeded_states(self, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        cpu = torch.Generator().manual_seed(seed).get_state()
        if not self._on_accelerator:
            return cpu, None
        return cpu, torch.Generator(device=self.device).manual_seed(seed).get_state()

    @contextmanager
    def _forked_rng(self) -> Iterator[None]:
        """The training's random states restored on exit, whatever runs inside."""
        if self._on_accelerator:
            index = self.device.index if self.device.index is not None else 0
            with torch.random.fork_rng(devices=[index], device_type=self.device.type):
                yield
        else:
            with torch.random.fork_rng(devices=[]):
                yield

    @contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Inside: the generator's own random state; after: the training's, untouched."""
        with self._forked_rng():
            torch.set_rng_state(self._cpu_state)
            module = torch.get_device_module(self.device.type) if self._on_accelerator else None
            if module is not None:
                module.set_rng_state(self._device_state, self.device)
            yield
            self._cpu_state = torch.get_rng_state()
            if module is not None:
                self._device_state = module.get_rng_state(self.device)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's seed and random states (NumPy ``uint8`` arrays)."""
        state: dict[str, Any] = {"seed": self.seed, "cpu": self._cpu_state.numpy().copy()}
        if self._device_state is not None:
            state["device"] = self._device_state.numpy().copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue sampling from the saved random state."""
        self.seed = int(state["seed"])
        self._cpu_state = torch.from_numpy(np.array(state["cpu"], dtype=np.uint8))
        if self._on_accelerator:
            if "device" not in state:
                raise UsageError(
                    f"the saved sampler state has no {self.device.type} random state: it was "
                    "saved by a generator on the CPU; resume with the generator on the CPU"
                )
            self._device_state = torch.from_numpy(np.array(state["device"], dtype=np.uint8))

    # -- weights ----------------------------------------------------------------------
    def _weight_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """The names ``load_weights`` needs (parameters and persistent buffers, a tied
        weight once) and the other names a tied weight is known by (accepted)."""
        required = {name for name, _ in self.model.named_parameters()}
        persistent = set(self.model.state_dict())
        buffers = {name for name, _ in self.model.named_buffers()} & persistent
        required |= buffers
        return frozenset(required), frozenset(persistent - required)

    @property
    def version(self) -> int | None:
        """The version of the weights held (``None``: none loaded yet)."""
        return self._version

    def load_weights(self, weights: Mapping[str, Any], version: int) -> None:
        """Copy whole tensors by Hugging Face name into the model; every name of the
        model must be given and no other (a ``UsageError`` names the first missing or
        unexpected one). Nothing is loaded when ``version`` is the one held."""
        if version == self._version:
            self.skipped_loads += 1
            log.info("generator weights unchanged (version %d): not loaded", version)
            return
        required, aliases = self._names
        given = set(weights)
        missing, unexpected = sorted(required - given), sorted(given - required - aliases)
        if missing or unexpected:
            what = [f"missing {missing[0]!r} (of {len(missing)})"] if missing else []
            what += [f"unexpected {unexpected[0]!r} (of {len(unexpected)})"] if unexpected else []
            raise UsageError(
                f"the policy's weights do not fit the generator's model: {'; '.join(what)}; "
                "build the generator from the policy's own Hugging Face config"
            )
        started = time.perf_counter()
        targets = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, value in weights.items():
                tensor, target = _as_tensor(value), targets[name]
                if tuple(tensor.shape) != tuple(target.shape):
                    raise UsageError(
                        f"the policy's weight {name!r} has shape {tuple(tensor.shape)}, the "
                        f"generator's model {tuple(target.shape)}; build the generator from "
                        "the policy's own Hugging Face config"
                    )
                target.copy_(tensor)
        self._version = version
        self.loads += 1
        log.debug(
            "generator weights version %d loaded (%d tensors, %.3f s)",
            version,
            len(weights),
            time.perf_counter() - started,
        )

    # -- sampling ---------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling) -> list[Completion]:
        """One completion per prompt, sampled together in a left-padded batch."""
        if not prompts:
            return []
        import transformers

        ids, mask = left_padded(prompts, sampling.pad_id, self.device)
        config = transformers.GenerationConfig(
            max_new_tokens=sampling.max_tokens,
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            repetition_penalty=1.0,
            pad_token_id=sampling.pad_id,
            eos_token_id=list(sampling.stop_ids) or None,
            output_logits=True,
            return_dict_in_generate=True,
            disable_compile=True,
        )
        with self._own_rng(), torch.no_grad():
            output = self.model.generate(
                input_ids=ids, attention_mask=mask, generation_config=config
            )
        generated = output.sequences[:, ids.shape[1] :].cpu()
        logps = torch.stack(
            [
                torch.log_softmax(step.float() / sampling.temperature, dim=-1)
                .gather(-1, generated[:, t : t + 1].to(step.device))
                .squeeze(-1)
                .cpu()
                for t, step in enumerate(output.logits)
            ],
            dim=1,
        )
        return [
            _completion(row.tolist(), row_logps.tolist(), sampling.stop_ids)
            for row, row_logps in zip(generated, logps, strict=True)
        ]


def _completion(ids: list[int], logps: list[float], stop_ids: Sequence[int]) -> Completion:
    """A row of ``generate``'s output cut after its first stop token (kept)."""
    stops = set(stop_ids)
    for i, token in enumerate(ids):
        if token in stops:
            return Completion(ids[: i + 1], logps[: i + 1], truncated=False)
    return Completion(ids, logps, truncated=True)
