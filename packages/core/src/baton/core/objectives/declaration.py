"""What an objective is: one typed declaration, as TorchTitan's ``TrainSpec`` gives every
plug-in point one slot.

An ``Objective`` holds everything baton knows about what a step minimises: its name, the
kind of prepared data it reads, its settings (each a flag with its help and checks),
whether it needs a reference model and how that model's log-probabilities are computed
and kept, the metric keys it logs, and its loss. The loss is written once, over what every
engine can hand it (``LossInputs``: per-token log-probabilities of the packed rows'
targets, the loss mask, each target's document, the documents' ids and the values the
rows carry per document or per token), against the array API standard
(``array_api_compat``), so the same function runs on torch tensors in Fabric, TorchTitan
and Megatron-Core and on JAX arrays inside MaxText's jitted step.

Every engine reduces a loss the same way: ``loss(...).total`` summed over the step's
micro-batches and data-parallel ranks, divided by ``items(...)`` summed the same way (the
supervised tokens, the pairs, the completions: whatever the objective averages over), so
a step's loss is one mean over the global batch whatever the layout. A metric is a
``(sum, weight)`` pair reduced the same way and reported as ``sum / weight``.

Example (a toy objective; the shipped ones are ``sft.py``, ``dpo.py``, ``grpo.py``)::

    def focal_loss(xp, inputs, settings):
        p = xp.exp(inputs.logps)
        weight = (1 - p) ** settings["focal_gamma"]
        mask = xp.astype(inputs.rows.mask, inputs.logps.dtype)
        return LossTerms(total=-xp.sum(weight * inputs.logps * mask))

    FOCAL = Objective(
        name="focal",
        summary="the focal loss over the supervised tokens of prepared conversations",
        data=DataKind.CONVERSATIONS,
        loss=focal_loss,
        items=supervised_tokens,
        settings=(Setting("focal_gamma", float, 2.0, "how much easy tokens are down-weighted",
                          at_least=0),),
    )
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from baton.core.errors import UsageError


class DataKind(StrEnum):
    """The kind of prepared data an objective reads (the data manifest's ``objective``)."""

    #: tokenized text (``baton data prepare`` without ``--seq-len``, or text files)
    TEXT = "pretrain"
    #: conversations packed into rows with a loss mask (``--seq-len N``)
    CONVERSATIONS = "sft"
    #: preference pairs packed into rows, chosen then rejected
    PAIRS = "preference"
    #: prompts for rollouts (prompt-only records)
    PROMPTS = "prompts"

    @property
    def described(self) -> str:
        """The kind in a user's words: ``"preference pairs"``."""
        return _DESCRIBED[self]


_DESCRIBED = {
    DataKind.TEXT: "pretraining text",
    DataKind.CONVERSATIONS: "conversations",
    DataKind.PAIRS: "preference pairs",
    DataKind.PROMPTS: "prompts",
}


class ReferenceUse(StrEnum):
    """Whether an objective compares the policy with a reference model, and how."""

    #: no reference model
    NONE = "none"
    #: each document's log-probability under the reference (the sum over its supervised
    #: targets) is computed once, by the engine that trains, before the first step, and
    #: stored beside the data under the reference's fingerprint (the ``reference_logps``
    #: document value)
    STORED = "stored"
    #: each rollout's per-token log-probabilities under the reference are computed as the
    #: rollout is made (the ``ref_logps`` token value)
    PER_ROLLOUT = "per_rollout"


@dataclass(frozen=True)
class Rows:
    """What the data says about a batch of packed rows, before any model has run: each
    ``[B, T]`` array is aligned with the targets (``targets[t]`` follows ``inputs[t]``).

    ``mask``: True where the target is supervised. ``segments``: the document (1..D) of
    each target's input token, 0 on padding. ``documents``: ``[B, D]``, the global index of
    document ``d + 1`` of each row (-1 where the row holds fewer). ``values``: the arrays
    the rows carry for the objective, ``[B, D]`` for its ``document_values`` and ``[B, T]``
    for its ``token_values``.
    """

    mask: Any
    segments: Any
    documents: Any
    values: Mapping[str, Any] = field(default_factory=dict[str, Any])


@dataclass(frozen=True)
class LossInputs:
    """What an engine hands an objective's loss: the ``rows`` and its model's output.

    ``logps``: ``[B, T]`` float32, ``log p(targets[b, t])`` under the model's logits
    divided by the objective's temperature (0 where nothing is predicted). ``entropy``:
    ``[B, T]`` float32, the entropy of each predicted distribution (same temperature), only
    when the objective asks for it (``Objective.entropy``); it carries no gradient.
    """

    rows: Rows
    logps: Any
    entropy: Any | None = None


@dataclass(frozen=True)
class LossTerms:
    """A loss on one micro-batch: ``total``, the sum of the loss over its items (the
    engine divides by the global batch's ``items``), and ``metrics``, each a
    ``(sum, weight)`` pair reported as ``sum / weight`` over the global batch. Metric
    arrays may still carry gradient history; engines detach them."""

    total: Any
    metrics: Mapping[str, tuple[Any, Any]] = field(default_factory=dict[str, tuple[Any, Any]])


class LossFunction(Protocol):
    """``loss(xp, inputs, settings) -> LossTerms``: ``xp`` is the array namespace of the
    inputs (``array_api_compat.array_namespace``), ``settings`` the run's values of the
    objective's settings."""

    def __call__(self, xp: Any, inputs: LossInputs, settings: Mapping[str, Any]) -> LossTerms: ...


class ItemsFunction(Protocol):
    """``items(xp, rows, settings) -> scalar``: what a loss is a mean over, counted from
    the data alone (computable before the forward pass, on the host or in a jitted step)."""

    def __call__(self, xp: Any, rows: Rows, settings: Mapping[str, Any]) -> Any: ...


@dataclass(frozen=True)
class Setting:
    """One setting of an objective: a recipe flag (``--dpo-beta``) with its type, default,
    help and bounds, checked once before anything is built.

    >>> beta = Setting("dpo_beta", float, 0.1, "DPO's beta", above=0)
    >>> beta.flag
    '--dpo-beta'
    >>> beta.check(0.0)
    Traceback (most recent call last):
    ...
    baton.core.errors.UsageError: --dpo-beta must be > 0, got 0.0
    """

    name: str
    #: the values' type (``float``, ``int``, ``str``, ``bool``)
    type: type
    default: Any
    help: str
    #: the accepted values, when they are a few names
    choices: tuple[Any, ...] = ()
    #: the value must be above this
    above: float | None = None
    #: the value must be at least this
    at_least: float | None = None
    #: the value must be at most this
    at_most: float | None = None
    #: ``None`` is accepted (the help says what it means)
    optional: bool = False
    #: given once per item (``--reward a --reward b``): a tuple of ``type``
    repeatable: bool = False
    #: several values after one flag (``--reward-weights 1.0 0.5``): a tuple of ``type``
    listed: bool = False
    #: names other tools use for this setting: not for recipes
    not_called: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def annotation(self) -> Any:
        """The type a command line parses this setting as."""
        if self.repeatable or self.listed:
            return tuple[self.type, ...]
        return self.type | None if self.optional else self.type

    def check(self, value: Any) -> None:
        """``UsageError`` (one line, the fix) unless ``value`` is acceptable."""
        if self.repeatable or self.listed:
            for item in value:
                self._check_one(item)
            return
        if value is None:
            if not self.optional:
                raise UsageError(f"{self.flag} needs a value")
            return
        self._check_one(value)

    def _check_one(self, value: Any) -> None:
        if self.choices and value not in self.choices:
            raise UsageError(
                f"{self.flag} {value!r}: use one of {', '.join(map(str, self.choices))}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            return
        if self.above is not None and not value > self.above:
            raise UsageError(f"{self.flag} must be > {self.above:g}, got {value}")
        if self.at_least is not None and not value >= self.at_least:
            raise UsageError(f"{self.flag} must be >= {self.at_least:g}, got {value}")
        if self.at_most is not None and not value <= self.at_most:
            raise UsageError(f"{self.flag} must be <= {self.at_most:g}, got {value}")


@dataclass(frozen=True)
class Objective:
    """One objective, declared once (see the module docstring)."""

    name: str
    #: one line: what a step minimises
    summary: str
    #: the prepared data it reads
    data: DataKind
    loss: LossFunction
    #: what the loss is a mean over (counted from the data)
    items: ItemsFunction
    #: the items in a user's words (``"supervised tokens"``)
    item_name: str = "supervised tokens"
    settings: tuple[Setting, ...] = ()
    #: its reference model: a ``ReferenceUse``, or a function of the settings' values
    reference: ReferenceUse | Callable[[Mapping[str, Any]], ReferenceUse] = ReferenceUse.NONE
    #: arrays the rows carry per document (``[B, D]``) for the loss
    document_values: tuple[str, ...] = ()
    #: arrays the rows carry per token (``[B, T]``) for the loss
    token_values: tuple[str, ...] = ()
    #: the keys of the loss's metrics (each a mean over the global batch)
    metrics: tuple[str, ...] = ()
    #: keys a step logs besides the loss's own (a rollout's rewards and timings)
    step_metrics: tuple[str, ...] = ()
    #: the keys worth a place on the console line besides the loss
    console_keys: tuple[str, ...] = ()
    #: the loss is the mean negative log-likelihood of the supervised targets: an engine
    #: may run its own (fused) cross entropy for it instead of ``loss``
    native_cross_entropy: bool = False
    #: the setting whose value divides the logits before the log-softmax (None: 1)
    temperature: str | None = None
    #: the loss (or its metrics) reads the per-token entropy
    entropy: bool = False
    #: each step first samples completions with the current weights and scores them
    rollouts: bool = False
    #: cross-setting checks: the problem and its fix, or None
    check: Callable[[Mapping[str, Any]], str | None] | None = None
    #: settings recorded but free to change on resume (paths whose content is what counts)
    changeable: frozenset[str] = frozenset()
    #: the learning-rate schedule after the warmup when a run does not choose one
    #: (``--lr-schedule``: ``constant``, ``linear`` or ``cosine``), the same on every
    #: engine (``baton.core.lr_schedule``)
    lr_schedule: str = "constant"

    def setting(self, name: str) -> Setting:
        for setting in self.settings:
            if setting.name == name:
                return setting
        raise KeyError(f"objective {self.name!r} has no setting {name!r}")

    def defaults(self) -> dict[str, Any]:
        return {s.name: s.default for s in self.settings}

    def reference_use(self, values: Mapping[str, Any]) -> ReferenceUse:
        """How this run uses a reference model, given its settings' values."""
        if isinstance(self.reference, ReferenceUse):
            return self.reference
        return self.reference(values)

    @property
    def fixed_on_resume(self) -> frozenset[str]:
        """The recorded settings a resume may not change: the objective, its settings (but
        the ``changeable`` ones) and, with a reference, the reference's fingerprint."""
        names = {"objective", *(s.name for s in self.settings)} - self.changeable
        if self.reference != ReferenceUse.NONE:
            names.add("reference_fingerprint")
        return frozenset(names)
