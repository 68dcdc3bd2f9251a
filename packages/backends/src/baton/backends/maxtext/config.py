"""The MaxText backend's native config: ``key=value`` overrides on a MaxText YAML.

``MaxTextConfig`` is what ``backend.config`` holds before ``setup``: callbacks edit it
in ``on_configure`` like a dict (``backend.config["learning_rate"] = 1e-3``), and
``setup`` hands it to MaxText's own ``pyconfig`` as the command line MaxText's
``train.py`` would get (``base.yml key=value ...``). No jax import here.

Example::

    config = MaxTextConfig(TINY_CPU | {"learning_rate": 3e-3, "steps": 200})
    config["per_device_batch_size"] = 4
    config.argv()   # ['baton', '.../maxtext/configs/base.yml', 'hardware=cpu', ...]
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.backends.maxtext.input_pipeline import DATASET_TYPES, native_data_overrides
from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec
from baton.core.objectives import DataKind, ObjectiveRun
from baton.core.objectives.pretrain import PRETRAIN
from baton.data import DataError

#: A small decoder that trains on CPU in seconds (about 0.2M parameters, byte vocabulary).
TINY_CPU: dict[str, Any] = {
    "hardware": "cpu",
    "skip_jax_distributed_system": True,
    "base_emb_dim": 64,
    "base_num_query_heads": 4,
    "base_num_kv_heads": 4,
    "base_mlp_dim": 128,
    "base_num_decoder_layers": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_target_length": 64,
    "per_device_batch_size": 4,
    "attention": "dot_product",
    "scan_layers": True,
    "learning_rate": 3e-3,
    "warmup_steps_fraction": 0.1,
    "log_config": False,
}

#: MaxText's settings of a model's shape (what ``describe()`` records and a reference
#: model is compared on, with others)
SHAPE_KEYS = (
    "base_emb_dim",
    "base_num_query_heads",
    "base_num_kv_heads",
    "base_mlp_dim",
    "base_num_decoder_layers",
    "head_dim",
    "vocab_size",
)

#: Keys baton owns: MaxText's checkpoint loop and monitors stay off because baton
#: checkpoints (orbax, through its Checkpoint callback) and logs.
FORCED: dict[str, Any] = {
    "enable_checkpointing": False,
    "save_checkpoint_on_start": False,
    "save_checkpoint_on_completion": False,
    "async_checkpointing": False,
    "enable_goodput_recording": False,
    "monitor_goodput": False,
    "enable_tensorboard": False,
}

_WHY_FORCED = {
    "enable_checkpointing": "baton writes orbax checkpoints itself (use the Checkpoint "
    "callback or driver.control.request_save)",
    "enable_goodput_recording": "baton's callbacks do the monitoring",
    "monitor_goodput": "baton's callbacks do the monitoring",
    "enable_tensorboard": "baton's loggers write TensorBoard",
}


def per_device_batch(batch_size: int, tp: int = 1, pp: int = 1) -> int | float:
    """MaxText's ``per_device_batch_size`` for a micro batch of ``batch_size`` per
    data-parallel rank (baton's ``--batch-size``): the devices of one model replica
    (``tp`` x ``pp``) share its batch; a fraction where it does not divide.

    >>> per_device_batch(8, tp=2)
    4
    """
    per_device = batch_size / (tp * pp)
    return int(per_device) if per_device.is_integer() else per_device


def eval_data_overrides(
    train: Mapping[str, Any], eval_data_path: str, tokenizer: str, vocab: Any
) -> dict[str, Any]:
    """The MaxText keys that make its pipeline build an evaluation iterator over
    ``eval_data_path`` (the same kind of data as training: one pipeline per run)."""
    native = native_data_overrides(eval_data_path, tokenizer, vocab)
    if native["dataset_type"] != train["dataset_type"]:
        raise DataError(
            f"evaluation data {eval_data_path!r} is read by MaxText's {native['dataset_type']} "
            f"pipeline, the training data by its {train['dataset_type']} pipeline: MaxText "
            "runs one pipeline; pass evaluation data of the training data's kind"
        )
    if native["dataset_type"] == "hf":
        return {"hf_eval_files": native["hf_train_files"], "eval_interval": 1}
    return {"grain_eval_files": native["grain_train_files"], "eval_interval": 1}


@functools.cache
def yaml_keys(path: str) -> frozenset[str]:
    """The top-level keys of a MaxText YAML (read once per process)."""
    import yaml

    with open(path) as handle:
        return frozenset(yaml.safe_load(handle) or {})


def packaged_base_yml() -> str:
    """Path of ``maxtext/configs/base.yml`` in the installed maxtext (found without importing it)."""
    spec = importlib.util.find_spec("maxtext")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "maxtext is not installed: uv sync --extra maxtext (baton-backends[maxtext])"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "configs" / "base.yml")


def format_value(value: Any) -> str:
    """One override value as MaxText's command line spells it (parsed by OmegaConf)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)


@dataclass
class MaxTextConfig:
    """MaxText overrides plus baton's data settings (the backend's native config).

    Args:
        overrides: MaxText config keys (``base.yml``, model YAMLs) and their values.
        base_config: a MaxText YAML; ``None`` means the packaged ``base.yml``.
        data_path: without ``tokenizer``: a UTF-8 text file for baton's byte stream
            (``None``: the Python language reference). With ``tokenizer``: a prepared
            dataset prefix or blend (MaxText's Grain ``mmap`` pipeline) or local
            JSON/Parquet files (MaxText's Hugging Face pipeline); see ``input_pipeline``.
        tokenizer: a Hugging Face tokenizer directory: MaxText's own pipelines read the data.
        eval_data_path: with ``tokenizer``: the evaluation data (a prepared prefix or
            JSON/Parquet files, the same kind as ``data_path``), read by MaxText's own
            pipeline (``grain_eval_files`` / ``hf_eval_files``). Without it a run on
            MaxText's pipelines has nothing to evaluate on. With an ``objective`` on
            prepared rows: other prepared data of the same kind, whose rows baton
            evaluates.
        eval_split: with an ``objective`` on prepared rows: the fraction of the packed
            rows held out for evaluation (the last ones; 0: none, every row trains).
        data_seed: the shuffling seed of the byte stream (MaxText's ``data_shuffle_seed``
            for its own pipelines).
        eval_batches: fixed validation batches per evaluation (byte stream).
        host_devices: simulated CPU devices for trying a mesh on CPU (fresh process only).
        objective: the objective and its settings (``ObjectiveRun``; a registered name is
            taken with its defaults). One reading text trains on ``data_path`` as above;
            any other reads a prefix written by ``baton data prepare --seq-len N`` whose
            rows baton feeds as MaxText batches (``packed_batches``), MaxText's own loss
            for an objective that is its cross entropy (``native_cross_entropy``), the
            objective's loss otherwise (``objective_loss``).
        init_from: where the starting weights come from (a Hugging Face directory or a
            checkpoint; loaded through ``load_parameters_path``): the default reference
            model of an objective that has one.
        warmup_steps: with it, the learning rate follows baton's schedule (linear
            warmup over these steps, then ``lr_schedule`` to ``learning_rate *
            learning_rate_final_fraction`` at ``learning_rate_schedule_steps``, the same
            as every backend: ``baton.core.lr_schedule``) instead of MaxText's own
            (``None``).
        lr_schedule: what baton's schedule does after the warmup: ``constant``,
            ``linear`` or ``cosine`` decay.
        model_spec: the Hugging Face architecture the run builds (``--model-config``,
            ``--init-from HF_DIR`` or the one a checkpoint recorded), whose names
            ``gather_weights`` gives the weights (``None``: the model has none).
    """

    overrides: dict[str, Any] = field(default_factory=lambda: dict(TINY_CPU))
    base_config: str | None = None
    data_path: str | None = None
    tokenizer: str | None = None
    eval_data_path: str | None = None
    eval_split: float = 0.0
    data_seed: int = 0
    eval_batches: int = 4
    host_devices: int | None = None
    objective: ObjectiveRun = field(default_factory=lambda: ObjectiveRun.of(PRETRAIN))
    init_from: str | None = None
    warmup_steps: int | None = None
    lr_schedule: str = "cosine"
    model_spec: ModelSpec | None = None

    def __post_init__(self) -> None:
        # the config owns its overrides: a dict passed in (TINY_CPU, a recipe's) is
        # never changed by later updates
        self.overrides = dict(self.overrides)
        self.check_settings(self.overrides)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "objective":  # a registered name (``--set objective=NAME``): its defaults
            value = ObjectiveRun.of(value)
        super().__setattr__(name, value)

    # dict-style access to the overrides, for on_configure callbacks
    def __getitem__(self, key: str) -> Any:
        return self.overrides[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.overrides[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self.overrides

    def __iter__(self) -> Iterator[str]:
        return iter(self.overrides)

    def get(self, key: str, default: Any = None) -> Any:
        return self.overrides.get(key, default)

    def apply_override(self, key: str, value: Any) -> None:
        """``baton run ... --set KEY=VALUE``: a MaxText setting (a key of the base YAML)
        or one of this config's own fields; an unknown key names the closest ones."""
        if key in self._own_fields():
            setattr(self, key, value)
            return
        from baton.core.cli.overrides import OverrideError

        try:
            self.check_settings([key], given_as="--set")
        except UsageError as error:
            raise OverrideError(str(error)) from None
        self.overrides[key] = value

    def update(self, values: Mapping[str, Any]) -> None:
        self.check_settings(values)
        self.overrides.update(values)

    def _own_fields(self) -> set[str]:
        return {f for f in self.__dataclass_fields__ if f != "overrides"}

    def check_settings(self, keys: Iterable[str], given_as: str = "MaxText override") -> None:
        """Refuse a key that is no setting of the base YAML in one line naming the closest
        (``learning_rat`` -> "did you mean learning_rate"), before MaxText lists all 700."""
        import difflib

        base = self.base_config or packaged_base_yml()
        known = yaml_keys(base)
        for key in keys:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known | self._own_fields()), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise UsageError(f"{given_as} {key}: not a MaxText setting of {base}{hint}")

    def check(self) -> None:
        """Reject overrides that would fight baton's ownership of checkpoints and monitors."""
        for key, forced in FORCED.items():
            if key in self.overrides and self.overrides[key] != forced:
                why = _WHY_FORCED.get(key, "baton sets it")
                raise ValueError(
                    f"MaxText override {key}={self.overrides[key]!r} is not supported by the baton "
                    f"backend: {why}. Remove it from the overrides."
                )
        dataset_type = self.overrides.get("dataset_type", "synthetic")
        if dataset_type not in DATASET_TYPES:
            raise ValueError(
                f"dataset_type={dataset_type!r} is not driven by baton: use synthetic (baton's "
                "byte stream, the default), or pass data_path and tokenizer for MaxText's grain "
                "(prepared data) or hf (JSON/Parquet) pipelines"
            )
        vocab = self.overrides.get("vocab_size")
        if self.byte_stream and vocab is not None and int(vocab) < 256:
            raise ValueError(
                f"vocab_size={vocab} is too small for byte-level text (ids 0-255); use >= 256"
            )

    @property
    def byte_stream(self) -> bool:
        """True when baton feeds its byte batches (no tokenizer, no MaxText pipeline)."""
        return (
            self.tokenizer is None
            and not self.post_training
            and (self.overrides.get("dataset_type", "synthetic") == "synthetic")
        )

    @property
    def post_training(self) -> bool:
        """True for an objective reading prepared rows, not text: baton feeds them
        (``packed_batches``)."""
        return self.objective.objective.data is not DataKind.TEXT

    def data_overrides(self) -> dict[str, Any]:
        """The MaxText keys that select the data pipeline (validated; see ``input_pipeline``)."""
        if self.post_training:  # checked by the recipe (maxtext/objective.py)
            return {"dataset_type": "synthetic"}  # baton feeds the rows
        if self.tokenizer is None:
            return {} if "dataset_type" in self.overrides else {"dataset_type": "synthetic"}
        if not self.data_path:
            raise ValueError(
                f"tokenizer {self.tokenizer} given without data: pass data_path (a prepared "
                "prefix or blend, or JSON/Parquet files)"
            )
        vocab = self.overrides.get("vocab_size")
        native = native_data_overrides(self.data_path, self.tokenizer, vocab)
        if self.eval_data_path:
            native |= eval_data_overrides(native, self.eval_data_path, self.tokenizer, vocab)
        return native | {"data_shuffle_seed": self.data_seed}

    @property
    def has_eval_data(self) -> bool:
        """Whether evaluation has data: the byte stream's held-out part, MaxText's
        synthetic batches, or ``eval_data_path`` for MaxText's own pipelines."""
        if self.post_training:
            return bool(self.eval_split or self.eval_data_path)
        return self.tokenizer is None or bool(self.eval_data_path)

    def merged(self) -> dict[str, Any]:
        """The overrides MaxText gets: the data pipeline's, the user's, then baton's forced keys."""
        self.check()
        return {**self.data_overrides(), **self.overrides, **FORCED}

    def argv(self, extra: Mapping[str, Any] | None = None) -> list[str]:
        """MaxText's command line: ``[prog, base.yml, key=value, ...]``.

        ``extra`` goes last, after baton's forced keys: for tools that run MaxText's own
        loop on the same settings (the parity test turns MaxText's checkpointing on).
        """
        base = self.base_config or packaged_base_yml()
        values = {**self.merged(), **(extra or {})}
        return ["baton", base, *(f"{k}={format_value(v)}" for k, v in values.items())]
