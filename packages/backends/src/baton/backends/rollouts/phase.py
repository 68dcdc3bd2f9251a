"""The rollout phase: the step's rollouts, made before each training step of a GRPO run.

The driver calls ``before_step(step)`` on every rank between ``on_step_start`` and the
backend's ``train_step`` (it is the driver's ``Rollouts`` collaborator). Every
``num_iterations`` steps it makes a new batch:

1. the policy's weights, when they changed since the generator last loaded them (their
   version is the count of optimizer steps done): ``gather_weights()`` (a collective the
   backend provides: whole tensors by Hugging Face name on the first rank) and
   ``generator.load_weights``;
2. the next ``B = rows_per_step / num_generations`` prompts of the seeded, resumable prompt
   order, each sampled ``num_generations`` times by the generator (first rank);
3. each reward function on the completions, their weighted sum, the group advantages
   (first rank), the reference's log-probabilities when there is a KL term;
4. the batch of rows (``baton.data.rollouts.RolloutBatch``) and the step's metrics,
   sent to every rank with ``broadcast`` (a collective the backend provides).

The steps in between reuse the batch (``num_iterations`` > 1): nothing is sampled and no
records are handed out. The engine's data stream reads ``phase.current`` and takes its
data-parallel share (``current.rows_of(rank, ranks)``) in micro-batches.

Metrics: TRL's rollout metrics (``reward``, ``reward_std``, ``rewards/<name>/mean|std``,
``frac_reward_zero_std``, ``completions/*``: ``baton.core.rollouts.advantages``) of the
batch the step trains on, ``timing/generation_s`` (the seconds making a new batch:
sampling, rewards, the reference, the broadcast; 0.0 on a reused one) and
``timing/weight_sync_s`` (gathering and loading the weights; 0.0 when unchanged).

Its state (the prompt order's position, the generator's random state, the batch not yet
used up, with its metrics) is saved in every checkpoint and restored on resume, so a
killed and resumed run samples the same completions and reaches the same weights.

Example::

    phase = build_rollout_phase(settings, prompts="data/math", policy="hf_models/sft",
                                tokenizer=load_tokenizer("hf_models/sft"), rows_per_step=16,
                                seq_len=768, seed=0, gather_weights=gather, broadcast=send,
                                is_first_rank=rank == 0)
    Driver(backend, callbacks, rollouts=phase, max_steps=100).fit()
    # the backend's data stream, inside train_step:
    share = phase.current.rows_of(rank, ranks)
    for micro in share.micro_batches(batch_size): ...
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from baton.core.errors import UsageError
from baton.core.rewards.function import Reward
from baton.core.rewards.scoring import RewardTable, score
from baton.core.rollouts.advantages import group_advantages, rollout_metrics
from baton.core.rollouts.generator import Completion, Generator, Sampling
from baton.data.prompt_order import PromptOrder
from baton.data.prompts import PreparedPrompts
from baton.data.rollouts import Rollout, RolloutBatch
from baton.data.tokenizer import TokenizerInfo, special_token_ids

if TYPE_CHECKING:
    from baton.backends.rollouts.scoring import ReferenceScorer

log = logging.getLogger("baton")

#: the files of the phase's state in a checkpoint's ``rollouts/`` folder
ARRAYS_FILE = "arrays.npz"
RECORDS_FILE = "records.json"


@dataclass(frozen=True)
class RolloutSettings:
    """What the phase needs of a run's GRPO settings (TRL's names and meanings)."""

    num_generations: int
    sampling: Sampling
    max_prompt_length: int
    num_iterations: int = 1
    mask_truncated_completions: bool = False
    scale_rewards: str = "group"


@dataclass(frozen=True)
class RolloutStep:
    """What ``before_step`` answers: the batch the step trains on, its records when
    they are new (``None`` on a reused batch) and the metrics the step logs."""

    batch: RolloutBatch
    records: tuple[Rollout, ...] | None
    metrics: dict[str, float] = field(default_factory=dict[str, float])


class RolloutPhase:
    """The rollout phase of a GRPO run (see the module's text).

    Args:
        prompts: the prepared prompts.
        seed: the seed of the prompt order.
        generator: samples completions (the first rank's; ``None`` elsewhere).
        rewards: the reward functions (TRL's signature), named and weighted.
        reference: the reference scorer of a KL term (first rank), or ``None``.
        settings: the GRPO settings it applies.
        rows_per_step: rollouts per step over every rank (B x G).
        seq_len: the rows' length (at least the longest prompt plus completion).
        decode: a completion's ids as text.
        gather_weights: the policy's weights by Hugging Face name on the first rank
            (``None`` elsewhere); called on every rank (a collective).
        broadcast: the first rank's object on every rank (a collective).
        is_first_rank: whether this rank samples.
    """

    def __init__(
        self,
        *,
        prompts: PreparedPrompts,
        seed: int,
        generator: Generator | None,
        rewards: Sequence[Reward],
        reference: ReferenceScorer | None,
        settings: RolloutSettings,
        rows_per_step: int,
        seq_len: int,
        decode: Callable[[Sequence[int]], str],
        gather_weights: Callable[[], Mapping[str, Any] | None],
        broadcast: Callable[[Any], Any],
        is_first_rank: bool,
    ) -> None:
        group = settings.num_generations
        if group < 2:
            raise UsageError(
                f"--num-generations {group}: GRPO compares completions of one prompt, so it "
                "needs at least 2; pass --num-generations 2 or more"
            )
        if rows_per_step % group:
            raise UsageError(
                f"--num-generations {group} does not divide the {rows_per_step} rollouts of a "
                "step (batch size x data-parallel ranks x gradient accumulation); make the "
                f"rollouts per step a multiple of {group}"
            )
        if settings.num_iterations < 1:
            raise UsageError(f"--num-iterations must be at least 1, not {settings.num_iterations}")
        prompts.check_prompt_length(settings.max_prompt_length)
        # the rows hold the data's longest prompt (at most --max-prompt-length) and the
        # longest completion
        longest = prompts.max_prompt_length + settings.sampling.max_tokens
        if seq_len < longest:
            raise UsageError(
                f"rows of {seq_len} tokens cannot hold the longest prompt of {prompts.prefix} "
                f"({prompts.max_prompt_length} tokens) and a completion of "
                f"--max-completion-length {settings.sampling.max_tokens}; pass --seq-len "
                f"{longest} or more"
            )
        if is_first_rank and generator is None:
            raise ValueError("the first rank samples: give it a generator")
        self.prompts = prompts
        self.generator = generator
        if not rewards:
            raise UsageError(
                "GRPO needs a reward: give --reward NAME (`baton rewards` lists them) or "
                "--reward rewards.py:my_reward"
            )
        for reward in rewards:
            reward.check_columns(prompts.columns)
        self.rewards = list(rewards)
        self.reference = reference
        self.settings = settings
        self.rows_per_step = rows_per_step
        self.seq_len = seq_len
        self.decode = decode
        self.gather_weights = gather_weights
        self.broadcast = broadcast
        self.is_first_rank = is_first_rank
        self.order = PromptOrder(
            num_prompts=len(prompts), per_step=rows_per_step // group, seed=seed
        )
        #: the batch the current step trains on (``None`` before the first step)
        self.current: RolloutBatch | None = None
        #: the step that sampled ``current``, and its metrics
        self._sampled_at: int | None = None
        self._metrics: dict[str, float] = {}
        #: the weights' version the generator was last given (every rank keeps it, so all
        #: agree whether to gather)
        self._synced: int | None = None

    @property
    def prompts_per_step(self) -> int:
        """B: prompts sampled per step."""
        return self.order.per_step

    # -- the step ---------------------------------------------------------------------
    def _new_batch_due(self, step: int) -> bool:
        return self.current is None or (step - 1) % self.settings.num_iterations == 0

    def before_step(self, step: int) -> RolloutStep:
        """Step ``step``'s rollouts (``step`` counts from 1): new ones every
        ``num_iterations`` steps, else the batch before."""
        if not self._new_batch_due(step):
            assert self.current is not None
            reused = {**self._metrics, "timing/generation_s": 0.0, "timing/weight_sync_s": 0.0}
            return RolloutStep(self.current, None, reused)
        sync_s = self._sync_weights(version=step - 1)
        started = time.perf_counter()
        indices = self.order.next_step()  # every rank moves along the order
        sampled = self._sample(step, indices) if self.is_first_rank else None
        batch, metrics = self.broadcast(sampled)
        generation_s = time.perf_counter() - started
        self.current, self._sampled_at, self._metrics = batch, step, dict(metrics)
        timing = {"timing/generation_s": generation_s, "timing/weight_sync_s": sync_s}
        return RolloutStep(batch, batch.records, {**metrics, **timing})

    def _sync_weights(self, version: int) -> float:
        """Gather and load the policy's weights when their version changed; the seconds."""
        if self._synced == version:
            return 0.0
        started = time.perf_counter()
        weights = self.gather_weights()
        if self.generator is not None:
            if weights is None:
                raise RuntimeError("gather_weights gave no weights on the first rank")
            self.generator.load_weights(weights, version)
        self._synced = version
        return time.perf_counter() - started

    def _sample(self, step: int, indices: Sequence[int]) -> tuple[RolloutBatch, dict[str, float]]:
        """The first rank's part: completions, rewards, advantages, rows and metrics."""
        assert self.generator is not None
        group = self.settings.num_generations
        prompt_indices = [index for index in indices for _ in range(group)]
        prompt_ids = [self.prompts.ids(index).tolist() for index in prompt_indices]
        completions = self.generator.generate(prompt_ids, self.settings.sampling)
        texts = [self.decode(c.ids) for c in completions]
        table = self._score(indices, completions, texts)
        result = group_advantages(
            table.rows, table.weights, group, scale_rewards=self.settings.scale_rewards
        )
        records = [
            Rollout(
                step=step,
                index=row,
                prompt_index=prompt_indices[row],
                prompt_ids=prompt_ids[row],
                completion_ids=list(completion.ids),
                completion=texts[row],
                rewards=table.row(row),
                reward=result.rewards[row],
                # the advantage as the loss reads it (float32 rows)
                advantage=float(np.float32(result.advantages[row])),
                logp_sum=math.fsum(completion.logps),
                truncated=completion.truncated,
                logps=[float(v) for v in completion.logps],
            )
            for row, completion in enumerate(completions)
        ]
        batch = RolloutBatch.build(
            records,
            [c.logps for c in completions],
            seq_len=self.seq_len,
            pad_id=self.settings.sampling.pad_id,
            mask_truncated_completions=self.settings.mask_truncated_completions,
        )
        if self.reference is not None:
            batch = batch.with_values(ref_logps=self.reference.score(batch))
        lengths = [len(c.ids) for c in completions]
        metrics = rollout_metrics(table, result, lengths, [c.truncated for c in completions])
        return batch, metrics

    def _score(
        self, indices: Sequence[int], completions: Sequence[Completion], texts: list[str]
    ) -> RewardTable:
        """Each reward function on the completions of the prompts ``indices``, given as
        TRL gives them: the prompts as prepared (text or turns), the completions' text
        (for turns, one assistant turn), their ids and each column of the prompts'
        records."""
        prompts, columns = self.prompts.for_rewards(indices, repeat=self.settings.num_generations)
        given: list[Any] = list(texts)
        if self.prompts.conversational:
            given = [[{"role": "assistant", "content": text}] for text in texts]
        return score(self.rewards, prompts, given, [list(c.ids) for c in completions], columns)

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs (NumPy arrays for the generator's random state and
        the batch not yet used up): the prompt order's position, the generator's state
        (first rank), the current batch with the step that sampled it and its metrics."""
        batch: dict[str, Any] | None = None
        if self.current is not None:
            arrays, records = self.current.to_state()
            batch = {
                "sampled_at": self._sampled_at,
                "arrays": arrays,
                "records": records,
                # JSON has no NaN (a metric of a batch nothing could score): null
                "metrics": {k: None if math.isnan(v) else v for k, v in self._metrics.items()},
            }
        return {
            "order": self.order.state_dict(),
            "generator": None if self.generator is None else self.generator.state_dict(),
            "batch": batch,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict``'s state."""
        self.order.load_state_dict(state["order"])
        if self.generator is not None:
            if state.get("generator") is None:
                raise UsageError(
                    "the saved rollout state holds no sampler state (it was saved on a rank "
                    "that does not sample); resume from a checkpoint written by the first rank"
                )
            self.generator.load_state_dict(state["generator"])
        batch = state.get("batch")
        if batch is None:
            self.current, self._sampled_at, self._metrics = None, None, {}
        else:
            self.current = RolloutBatch.from_state(batch["arrays"], batch["records"])
            self._sampled_at = batch["sampled_at"]
            self._metrics = {
                str(k): math.nan if v is None else float(v) for k, v in batch["metrics"].items()
            }
        self._synced = None  # the weights are gathered again before the next sampling

    def save(self, directory: Path, *, write: bool) -> dict[str, Any]:
        """The driver's checkpoint hook: arrays (``arrays.npz``) and the batch's records
        (``records.json``) into ``directory`` when ``write``; the rest returned as JSON
        data for ``baton.json``."""
        state, arrays, records = split_state(self.state_dict())
        if write:
            directory.mkdir(parents=True, exist_ok=True)
            with open(directory / ARRAYS_FILE, "wb") as stream:
                np.savez(stream, **arrays)
            (directory / RECORDS_FILE).write_text(json.dumps(records), encoding="utf-8")
        return state

    def load(self, directory: Path, state: Mapping[str, Any]) -> None:
        """The driver's resume hook: the state ``save`` wrote."""
        with np.load(directory / ARRAYS_FILE) as stored:
            arrays = {name: stored[name] for name in stored.files}
        records = json.loads((directory / RECORDS_FILE).read_text(encoding="utf-8"))
        self.load_state_dict(join_state(state, arrays, records))


#: the key a JSON state holds in place of an array: the array's name in ``arrays.npz``
ARRAY_KEY = "__array__"


def split_state(
    state: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, np.ndarray], list[dict[str, Any]] | None]:
    """``(json, arrays, records)``: the phase's state with each array replaced by
    ``{"__array__": name}`` and the batch's records taken out."""
    arrays: dict[str, np.ndarray] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, np.ndarray):
            arrays[path] = value
            return {ARRAY_KEY: path}
        if isinstance(value, Mapping):
            return {str(k): walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
        return value

    plain = dict(state)
    batch = plain.get("batch")
    records = None
    if batch is not None:
        records = batch["records"]
        plain["batch"] = {k: v for k, v in batch.items() if k != "records"}
    return walk(plain, ""), arrays, records


def join_state(
    state: Mapping[str, Any], arrays: Mapping[str, np.ndarray], records: Any
) -> dict[str, Any]:
    """The state ``split_state`` took apart."""

    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            if set(value) == {ARRAY_KEY}:  # pyright: ignore[reportUnknownArgumentType]
                return arrays[value[ARRAY_KEY]]
            return {str(k): walk(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
        return value

    joined = walk(state)
    if joined.get("batch") is not None:
        joined["batch"]["records"] = records
    return joined


def stop_ids(tokenizer: TokenizerInfo, policy: str | Path) -> tuple[int, ...]:
    """The ids a completion ends at, as TRL's ``GRPOTrainer`` takes them: the tokenizer's
    end-of-sequence id, then those of the policy's ``generation_config.json``."""
    ids = [tokenizer.eod_id]
    config = Path(policy) / "generation_config.json"
    if config.is_file():
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token_id")
        for value in eos if isinstance(eos, list) else [eos]:
            if isinstance(value, int) and value not in ids:
                ids.append(value)
    return tuple(ids)


def make_generator(choice: str, policy: str | Path, device: str, seed: int) -> Generator:
    """The generator ``--generator`` names: ``transformers`` (``TransformersGenerator`` of
    the policy's architecture) or ``recorded:FILE.jsonl`` (``RecordedGenerator``)."""
    from baton.backends.rollouts.recorded import PREFIX, RecordedGenerator

    if choice.startswith(PREFIX):
        return RecordedGenerator(choice[len(PREFIX) :])
    from baton.backends.rollouts.hf_generator import TransformersGenerator

    return TransformersGenerator(policy, device=device, seed=seed)


def build_rollout_phase(
    settings: Mapping[str, Any],
    *,
    prompts: str | Path,
    policy: str | Path,
    tokenizer: TokenizerInfo,
    rows_per_step: int,
    seed: int,
    gather_weights: Callable[[], Mapping[str, Any] | None],
    broadcast: Callable[[Any], Any],
    is_first_rank: bool,
    seq_len: int | None = None,
    device: str = "cpu",
    rewards: Sequence[Reward] | None = None,
) -> RolloutPhase:
    """The rollout phase of a GRPO run, wired the same way on every engine.

    Args:
        settings: the GRPO settings by TRL's names (an ``ObjectiveRun``'s values):
            ``num_generations``, ``max_prompt_length``, ``max_completion_length``,
            ``temperature``, ``top_p``, ``top_k``, ``num_iterations``,
            ``mask_truncated_completions``, ``scale_rewards``, ``beta``, ``reference``,
            ``reward`` and ``reward_weights``.
        prompts: the prepared prompts' prefix (checked against ``tokenizer``).
        policy: the policy's Hugging Face directory: the generator's model (its config;
            its weights come from ``gather_weights``), its ``generation_config.json``'s
            stop ids, and the reference of a KL term when ``reference`` is None.
        tokenizer: the run's tokenizer (end-of-sequence and padding ids, decoding).
        rows_per_step: rollouts per step over every rank (batch size x data-parallel
            ranks x gradient accumulation).
        seed: the seed of the prompt order and of the sampler.
        gather_weights, broadcast, is_first_rank: the backend's collectives and rank
            (see ``RolloutPhase``).
        seq_len: the rows' length (default: the prompts' longest plus
            ``max_completion_length``).
        device: where the generator and the reference run.
        rewards: the reward functions (default: built from ``reward`` and
            ``reward_weights``).
    """
    from transformers import AutoTokenizer

    from baton.backends.rollouts.scoring import ReferenceScorer
    from baton.core.cli.reward_flags import load_rewards

    data = PreparedPrompts(prompts)
    data.check_tokenizer(tokenizer)
    if rewards is None:
        rewards = load_rewards(list(settings["reward"]), list(settings["reward_weights"]) or None)
    pad_id = special_token_ids(tokenizer)["pad_token_id"]
    sampling = Sampling(
        temperature=float(settings["temperature"]),
        top_p=float(settings["top_p"]),
        top_k=int(settings["top_k"]),
        max_tokens=int(settings["max_completion_length"]),
        stop_ids=stop_ids(tokenizer, policy),
        pad_id=tokenizer.eod_id if pad_id is None else pad_id,
    )
    rollout = RolloutSettings(
        num_generations=int(settings["num_generations"]),
        sampling=sampling,
        max_prompt_length=int(settings["max_prompt_length"]),
        num_iterations=int(settings["num_iterations"]),
        mask_truncated_completions=bool(settings["mask_truncated_completions"]),
        scale_rewards=str(settings["scale_rewards"]),
    )
    generator: Generator | None = None
    reference = None
    if is_first_rank:
        generator = make_generator(
            str(settings.get("generator", "transformers")), policy, device, seed
        )
        if float(settings["beta"]) != 0.0:
            reference = ReferenceScorer(
                settings.get("reference") or policy, device=device, temperature=sampling.temperature
            )
    hf_tokenizer = AutoTokenizer.from_pretrained(tokenizer.path)

    def decode(ids: Sequence[int]) -> str:  # TRL's batch_decode(skip_special_tokens=True)
        return str(hf_tokenizer.decode(list(ids), skip_special_tokens=True))

    return RolloutPhase(
        prompts=data,
        seed=seed,
        generator=generator,
        rewards=rewards,
        reference=reference,
        settings=rollout,
        rows_per_step=rows_per_step,
        seq_len=seq_len or data.max_prompt_length + sampling.max_tokens,
        decode=decode,
        gather_weights=gather_weights,
        broadcast=broadcast,
        is_first_rank=is_first_rank,
    )
