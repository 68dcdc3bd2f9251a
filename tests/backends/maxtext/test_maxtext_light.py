"""Fast MaxText-backend tests that never import jax or maxtext (data, config, patches)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from baton.backends.maxtext.byte_stream import BATCH_KEYS, TextBatches, TextCorpus, eval_batches
from baton.backends.maxtext.config import FORCED, TINY_CPU, MaxTextConfig, format_value
from baton.backends.maxtext.patches import NO_DUMP_XLA_FLAGS
from baton.core import Driver
from baton.core.patches import select_patches


def test_import_registers_backend_and_patches_without_jax() -> None:
    code = (
        "import sys\n"
        "import baton.backends.maxtext\n"
        "from baton.core.registry import BACKENDS\n"
        "from baton.core.patches import patches_for\n"
        "cls = BACKENDS.get('maxtext')\n"
        "names = sorted(p.name for p in patches_for('maxtext'))\n"
        "heavy = sorted(m for m in ('jax', 'maxtext', 'torch', 'flax') if m in sys.modules)\n"
        "print(cls.__name__, ','.join(names), heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    name, patches, heavy = done.stdout.split(maxsplit=2)
    assert name == "MaxTextBackend"
    assert patches.split(",") == [
        "maxtext_compilation_cache",
        "maxtext_cpu_platform",
        "maxtext_host_devices",
        "maxtext_jax_settings",
        "maxtext_moe_load_metrics",
        "maxtext_no_hlo_dump",
        "maxtext_objective_loss",
        "maxtext_output_dir",
        "maxtext_quiet",
        "maxtext_root_logger",
    ]
    assert heavy.strip() == "[]"


def test_cli_lists_maxtext_patches(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from baton.core.cli.command import main

    monkeypatch.setenv("COLUMNS", "250")  # the table's names stay whole
    assert main(["patches", "--backend", "maxtext"]) == 0
    out = capsys.readouterr().out
    assert "maxtext_no_hlo_dump" in out and ">=0.2.5,<0.3" in out


# -- data ---------------------------------------------------------------------------
def test_batches_are_maxtext_format_on_real_text() -> None:
    corpus = TextCorpus.load()
    assert "language reference" in corpus.source and len(corpus.train) > 400_000
    stream = TextBatches(corpus.train, batch_size=3, seq_len=16, seed=0)
    batch = next(stream)
    assert tuple(batch) == BATCH_KEYS
    for value in batch.values():
        assert value.shape == (3, 16) and value.dtype == np.int32
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    np.testing.assert_array_equal(batch["inputs_position"][0], np.arange(16))
    assert batch["targets_segmentation"].min() == 1  # every target counts
    text = bytes(batch["inputs"][0].astype(np.uint8)).decode("utf-8", errors="replace")
    assert sum(c.isalpha() or c.isspace() for c in text) > 8  # English prose, not noise


def test_stream_resumes_exactly_and_crosses_epochs() -> None:
    data = TextCorpus.load().train[:5000]
    first = TextBatches(data, batch_size=4, seq_len=32, seed=3)
    seen = [next(first) for _ in range(first.order.batches_per_epoch + 3)]  # into epoch 2
    state = first.state_dict()
    later = next(first)
    resumed = TextBatches(data, batch_size=4, seq_len=32, seed=3)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(next(resumed)["inputs"], later["inputs"])
    # a new epoch is a different order of the same windows
    assert not np.array_equal(seen[0]["inputs"], seen[first.order.batches_per_epoch]["inputs"])
    other = TextBatches(data, batch_size=4, seq_len=32, seed=4)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_too_small_corpus_and_eval_batches() -> None:
    data = np.arange(100, dtype=np.int32)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        TextBatches(data, batch_size=8, seq_len=32)
    fixed = eval_batches(TextCorpus.load().val, batch_size=2, seq_len=16, num_batches=3)
    again = eval_batches(TextCorpus.load().val, batch_size=2, seq_len=16, num_batches=3)
    assert len(fixed) == 3 and all(b["inputs"].shape == (2, 16) for b in fixed)
    np.testing.assert_array_equal(fixed[2]["targets"], again[2]["targets"])


def test_missing_data_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        TextCorpus.load(tmp_path / "nope.txt")


# -- config -------------------------------------------------------------------------
def test_config_argv_and_dict_access() -> None:
    config = MaxTextConfig(TINY_CPU | {"steps": 7})
    config["learning_rate"] = 1e-3
    argv = config.argv()
    assert argv[1].endswith("maxtext/configs/base.yml") and Path(argv[1]).is_file()
    assert "steps=7" in argv and "learning_rate=0.001" in argv
    assert "skip_jax_distributed_system=true" in argv  # MaxText's spelling of booleans
    for key, value in FORCED.items():
        assert f"{key}={format_value(value)}" in argv
    extra = config.argv({"enable_checkpointing": True})
    assert "enable_checkpointing=true" in extra and "enable_checkpointing=false" not in extra
    assert format_value([1, "a"]) == "[1,a]"


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("dataset_type", "tfds", "tokenizer"),
        ("enable_checkpointing", True, "Checkpoint"),
        ("vocab_size", 128, "byte-level"),
    ],
)
def test_config_rejects_what_baton_owns(key: str, value: object, match: str) -> None:
    config = MaxTextConfig(TINY_CPU | {key: value})
    with pytest.raises(ValueError, match=match):
        config.argv()


def test_backend_rejects_unknown_field() -> None:
    from baton.backends.maxtext.backend import MaxTextBackend

    with pytest.raises(TypeError, match="overrides"):
        MaxTextBackend(learning_rate=1e-3)


# -- patches ------------------------------------------------------------------------
def test_patch_decisions_follow_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from baton.backends.maxtext.backend import MaxTextBackend

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    backend = MaxTextBackend(overrides={"dump_hlo": True, "jax_cache_dir": "/tmp/x"})
    _, decisions = select_patches(backend, "all")
    applied = {d.name: d for d in decisions}
    assert not applied["maxtext_cpu_platform"].applied  # JAX_PLATFORMS already set
    assert "HLO dump" in applied["maxtext_no_hlo_dump"].reason
    assert not applied["maxtext_compilation_cache"].applied

    monkeypatch.delenv("JAX_PLATFORMS")
    backend = MaxTextBackend()
    driver = Driver(backend, max_steps=1, run_dir=tmp_path / "run")
    patches, _ = select_patches(
        backend,
        "maxtext_cpu_platform,maxtext_no_hlo_dump,maxtext_compilation_cache,maxtext_output_dir",
    )
    for patch in patches:
        patch.apply(driver, patch.recorder)
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    assert os.environ["XLA_FLAGS"] == NO_DUMP_XLA_FLAGS
    assert backend.config["jax_cache_dir"] == str((tmp_path / "run" / "jax_cache").resolve())
    assert backend.config["base_output_directory"].startswith(str(tmp_path.resolve()))
    for patch in reversed(patches):
        patch.on_teardown(driver)
    assert "JAX_PLATFORMS" not in os.environ and "XLA_FLAGS" not in os.environ
    assert "jax_cache_dir" not in backend.config and "base_output_directory" not in backend.config


# -- MaxText's own pipelines: bad input named before MaxText starts --------------------
@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from baton.data import train_tokenizer

    return train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400).path


def test_tokenizer_larger_than_vocab_names_both(bpe: Path, tmp_path: Path) -> None:
    from baton.data import DataError

    config = MaxTextConfig(TINY_CPU, data_path=str(tmp_path / "corpus"), tokenizer=str(bpe))
    with pytest.raises(DataError, match=r"400 tokens.*256 rows"):
        config.argv()


def test_missing_index_and_missing_tokenizer_are_named(bpe: Path, tmp_path: Path) -> None:
    from baton.data import DataError

    (tmp_path / "corpus.bin").write_bytes(b"\0" * 16)
    config = MaxTextConfig(
        TINY_CPU | {"vocab_size": 512}, data_path=str(tmp_path / "corpus"), tokenizer=str(bpe)
    )
    with pytest.raises(DataError, match=r"corpus\.idx"):
        config.argv()
    config = MaxTextConfig(TINY_CPU, data_path=str(tmp_path / "corpus"), tokenizer=None)
    config["dataset_type"] = "grain"  # MaxText keys alone are passed through as given
    assert "dataset_type=grain" in config.argv()
    no_data = MaxTextConfig(TINY_CPU | {"vocab_size": 512}, tokenizer=str(bpe))
    with pytest.raises(ValueError, match="data_path"):
        no_data.argv()


def test_hf_files_select_maxtexts_hugging_face_pipeline(bpe: Path, tmp_path: Path) -> None:
    from baton.backends.maxtext.input_pipeline import maxtext_mixture, native_data_overrides

    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    overrides = native_data_overrides(str(data), bpe, vocab_size=512)
    assert overrides["dataset_type"] == "hf" and overrides["hf_path"] == "json"
    assert overrides["hf_train_files"] == str(data.resolve())
    assert overrides["tokenizer_type"] == "huggingface"
    assert maxtext_mixture("a,0.7;b,0.3") == (["a", "b"], [0.7, 0.3])
    assert maxtext_mixture("0.7 a 0.3 b") == (["a", "b"], [0.7, 0.3])


def test_llama_recipe_refuses_to_start_without_data() -> None:
    from baton.core.cli.recipe import build_driver

    recipe = Path(__file__).resolve().parents[3] / "recipes" / "maxtext_llama2_7b.py"
    with pytest.raises(ValueError, match="--data-path.*--tokenizer"):
        build_driver(recipe, ["--hardware=gpu"])


def test_set_overrides_maxtext_settings_by_name() -> None:
    from baton.backends.maxtext import MaxTextConfig
    from baton.core.cli.overrides import OverrideError, apply_overrides

    config = MaxTextConfig()
    apply_overrides(config, ["base_emb_dim=128", "per_device_batch_size=4", "data_seed=7"])
    assert config["base_emb_dim"] == 128 and config["per_device_batch_size"] == 4
    assert config.data_seed == 7
    with pytest.raises(OverrideError, match="did you mean base_emb_dim"):
        apply_overrides(config, ["base_emb_dims=64"])


def test_a_mistyped_override_is_one_line_naming_the_closest_setting(capsys) -> None:
    from baton.core.cli.command import main

    recipe = Path(__file__).resolve().parents[3] / "recipes" / "maxtext_tiny.py"
    assert main(["run", str(recipe), "--overrides", "learning_rat=1e-3"]) == 2
    err = capsys.readouterr().err
    assert "override learning_rat: not a MaxText setting" in err
    assert "did you mean learning_rate" in err and len(err) < 400


def test_config_never_changes_the_dict_it_was_given() -> None:
    given = dict(TINY_CPU)
    config = MaxTextConfig(given)
    config.update({"dataset_type": "grain"})
    config["steps"] = 3
    assert given == TINY_CPU and "dataset_type" not in given


def test_stream_resumes_at_the_next_window_with_another_global_batch() -> None:
    """Saved at global batch 8 (two processes), resumed at 4 (one), then at 8 again: every
    window of the epoch is read exactly once, a checkpoint of the old format too."""
    data = np.arange(16 * 100 + 1, dtype=np.int32)  # window i starts with token 16 * i

    def windows(stream: TextBatches, batches: int) -> list[int]:
        return [int(w) // 16 for _ in range(batches) for w in next(stream)["inputs"][:, 0]]

    two = TextBatches(data, batch_size=8, seq_len=16, seed=5)
    read = windows(two, 3)
    one = TextBatches(data, batch_size=4, seq_len=16, seed=5)
    one.load_state_dict(two.state_dict())
    read += windows(one, 3)
    again = TextBatches(data, batch_size=8, seq_len=16, seed=5)
    again.load_state_dict(one.state_dict())
    read += windows(again, (100 - 36) // 8)
    assert len(read) == len(set(read)) == 100 and set(read) == set(range(100))
    assert again.order.epoch == 0 and windows(again, 1) and again.order.epoch == 1
    old_format = {k: v for k, v in two.state_dict().items() if k not in ("epoch", "position")}
    resumed = TextBatches(data, batch_size=4, seq_len=16, seed=5)
    resumed.load_state_dict(old_format)
    assert windows(resumed, 1) == read[24:28]


def test_the_saved_position_counts_batches_under_the_key_checkpoints_hold() -> None:
    data = np.arange(16 * 20 + 1, dtype=np.int32)
    stream = TextBatches(data, batch_size=4, seq_len=16, seed=1)
    next(stream), next(stream)
    state = stream.state_dict()
    assert stream.batches_read == 2 and state["consumed"] == 2 and state["position"] == 8
    written_before = {"consumed": 2, "epoch": 0, "position": 8, "seed": 1, "batch_size": 4,
                      "seq_len": 16}  # fmt: skip
    resumed = TextBatches(data, batch_size=4, seq_len=16, seed=1)
    resumed.load_state_dict(written_before)
    assert resumed.batches_read == 2
    np.testing.assert_array_equal(next(resumed)["inputs"], next(stream)["inputs"])
