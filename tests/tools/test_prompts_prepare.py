"""`baton data prepare` on prompt-only records (GRPO's prompts): the ids TRL's
`GRPOTrainer` gives the same prompts, the records with their columns, from JSON Lines,
Parquet and a saved dataset; `baton data inspect`; and every refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from baton.data import DataError, load_tokenizer, resolve_tokenizer
from baton.data.packed import check_objective, data_objective
from baton.data.prompts import PreparedPrompts, records_path
from baton.tools.data.cli import main

TEXT_PROMPTS = [
    {"prompt": "the model reads a short story about rivers", "answer": "4", "level": 1},
    {"prompt": "why cats sleep all day near warm windows", "answer": "12", "level": 2},
    {"prompt": "trains run through cities at night", "answer": "-3.5", "level": None},
]
TURN_PROMPTS = [
    {
        "prompt": [
            {"role": "system", "content": "answer with care"},
            {"role": "user", "content": "how do trains run at night"},
        ],
        "solution": "under bright stars",
    },
    {"prompt": [{"role": "user", "content": "the story about mountains"}], "solution": "rivers"},
    {
        "prompt": [
            {"role": "user", "content": "a short question"},
            {"role": "assistant", "content": "a clear answer"},
            {"role": "user", "content": "and then"},
        ],
        "solution": "why",
    },
]


def jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def baton_data(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    status = main([*map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def with_bos(source: Path, directory: Path) -> Path:
    """``source``'s tokenizer with a post-processor that puts ``<|endoftext|>`` before every
    text, as Llama's adds its BOS: text prompts get it, rendered turns do not."""
    import shutil

    from tokenizers import Tokenizer, processors

    shutil.copytree(source, directory)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    bos = tokenizer.token_to_id("<|endoftext|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from support.posttrain import chat_tokenizer, tiny_model

    root = tmp_path_factory.mktemp("prompts")
    plain = chat_tokenizer(root / "tok")
    return {
        "tokenizer": with_bos(plain, root / "tok-bos"),
        "plain": plain,
        "model": tiny_model(root / "model"),
        "root": root,
    }


def trl_prompt_ids(files: dict[str, Path], prompts: list[Any]) -> list[list[int]]:
    """The ids TRL 1.16's ``GRPOTrainer`` gives ``prompts`` (its ``_tokenize_prompts``)."""
    import tempfile

    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    def length(completions: list[Any], **_: Any) -> list[float | None]:
        return [0.0 for _ in completions]

    with tempfile.TemporaryDirectory() as output:
        config = GRPOConfig(
            output_dir=output,
            per_device_train_batch_size=2,
            num_generations=2,
            max_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(files["model"]),
            reward_funcs=length,
            args=config,
            train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=AutoTokenizer.from_pretrained(files["tokenizer"]),
        )
        ids = trainer._tokenize_prompts(prompts)[0]  # pyright: ignore[reportPrivateUsage]
    return [list(map(int, row)) for row in ids]


def write_inputs(directory: Path, records: list[dict[str, Any]]) -> dict[str, Path]:
    """The same records as JSON Lines, Parquet and a saved ``datasets`` directory."""
    import datasets

    directory.mkdir(parents=True, exist_ok=True)
    dataset = datasets.Dataset.from_list(records)
    dataset.to_parquet(str(directory / "prompts.parquet"))
    dataset.save_to_disk(str(directory / "saved"))
    return {
        "jsonl": jsonl(directory / "prompts.jsonl", records),
        "parquet": directory / "prompts.parquet",
        "dataset": directory / "saved",
    }


@pytest.mark.parametrize(("kind", "records"), [("text", TEXT_PROMPTS), ("turns", TURN_PROMPTS)])
def test_prompts_are_tokenized_as_trl_tokenizes_them(
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    records: list[dict[str, Any]],
) -> None:
    inputs = write_inputs(tmp_path / "in", records)
    capsys.readouterr()  # the datasets library's progress bars
    expected = trl_prompt_ids(files, [record["prompt"] for record in records])
    capsys.readouterr()  # transformers' progress bars
    bos = load_tokenizer(files["tokenizer"]).eod_id
    # text gets the tokenizer's BOS, rendered turns do not: the test sees both behaviours
    assert [ids[0] == bos for ids in expected] == [kind == "text"] * len(records)
    written = []
    for name, source in inputs.items():
        output = tmp_path / f"out-{name}" / "prompts"
        status, out, err = baton_data(
            capsys, "prepare", source, "--tokenizer", files["tokenizer"], "--output", output
        )
        assert (status, err) == (0, ""), err
        assert f"{len(records)} prompts" in out and f"(prompts, {kind})" in out
        prompts = PreparedPrompts(output)
        assert [prompts.ids(i).tolist() for i in range(len(prompts))] == expected
        assert prompts.max_prompt_length == max(map(len, expected))
        assert [prompts.length(i) for i in range(len(prompts))] == list(map(len, expected))
        columns = [key for key in records[0] if key != "prompt"]
        assert prompts.columns == columns
        # each record as given, every column in every record
        for index, record in enumerate(records):
            got = prompts.record(index)
            assert got["prompt"] == record["prompt"]
            assert {c: got[c] for c in columns} == {c: record.get(c) for c in columns}
        given, by_column = prompts.for_rewards([2, 0], repeat=2)
        assert given == [records[2]["prompt"]] * 2 + [records[0]["prompt"]] * 2
        assert by_column == {c: [records[2].get(c)] * 2 + [records[0].get(c)] * 2 for c in columns}
        manifest = prompts.manifest
        assert (manifest["objective"], manifest["format"]) == ("prompts", "baton-prepared-data/2")
        assert manifest["conversational"] is (kind == "turns")
        assert (
            manifest["tokenizer"]["fingerprint"] == load_tokenizer(files["tokenizer"]).fingerprint
        )
        if kind == "turns":
            assert manifest["template"]["source"] == "tokenizer"
            assert len(manifest["template"]["sha256"]) == 64
        else:
            assert manifest["template"] is None
        assert manifest["sources"][0]["documents"] == len(records)
        assert manifest["sources"][0]["tokens"] == sum(map(len, expected))
        assert data_objective(output) == "prompts"
        written.append(Path(f"{output}.bin").read_bytes())
    assert written[0] == written[1] == written[2]


def test_null_fields_of_other_formats_are_no_columns(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Parquet holds every column in every row: a prompt's null ``completion`` is absent."""
    import datasets

    table = {"prompt": ["p one", "p two"], "completion": [None, None], "answer": ["1", None]}
    datasets.Dataset.from_dict(table).to_parquet(str(tmp_path / "p.parquet"))
    capsys.readouterr()
    output = tmp_path / "out"
    status, _, err = baton_data(
        capsys,
        "prepare",
        tmp_path / "p.parquet",
        "--tokenizer",
        files["tokenizer"],
        "--output",
        output,
    )
    assert (status, err) == (0, "")
    prompts = PreparedPrompts(output)
    assert prompts.columns == ["answer"]
    assert [prompts.record(i) for i in range(2)] == [
        {"prompt": "p one", "answer": "1"},
        {"prompt": "p two", "answer": None},
    ]


def test_inspect_shows_prompts_and_their_columns(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = jsonl(tmp_path / "p.jsonl", TURN_PROMPTS)
    output = tmp_path / "p"
    assert (
        baton_data(
            capsys, "prepare", source, "--tokenizer", files["tokenizer"], "--output", output
        )[0]
        == 0
    )
    status, out, err = baton_data(capsys, "inspect", output, "-n", "2")
    assert (status, err) == (0, ""), err
    prompts = PreparedPrompts(output)
    longest = max(range(len(prompts)), key=prompts.length)
    assert f"{len(TURN_PROMPTS)} prompts" in out
    assert f"longest    {prompts.max_prompt_length} tokens (prompt {longest})" in out
    assert "columns    solution" in out
    assert out.count("--- prompt ") == 2
    assert "<|im_start|>system\nanswer with care<|im_end|>" in out
    assert out.rstrip().endswith("solution: 'rivers'")


def test_prompts_feed_grpo_only(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    """``--objective grpo`` reads prompts; SFT, DPO and pretraining refuse them, and GRPO
    refuses conversations, pairs and text, each naming the fix."""
    from support.posttrain import preference_prefix, sft_prefix

    prompts = tmp_path / "prompts"
    source = jsonl(tmp_path / "p.jsonl", TEXT_PROMPTS)
    assert (
        baton_data(
            capsys, "prepare", source, "--tokenizer", files["tokenizer"], "--output", prompts
        )[0]
        == 0
    )
    check_objective(prompts, "grpo")
    for objective in ("sft", "dpo", "pretrain"):
        with pytest.raises(DataError) as error:
            check_objective(prompts, objective)
        assert (
            f"holds prompts data (prepared for --objective grpo), but --objective {objective}"
            in str(error.value)
        )
        assert "pass --objective grpo" in str(error.value)
    sft = sft_prefix(tmp_path / "sft", files["plain"], seq_len=64)
    pairs = preference_prefix(tmp_path / "pairs", files["plain"], seq_len=64)
    for other, kind in ((sft, "sft"), (pairs, "preference")):
        with pytest.raises(
            DataError, match=f"holds {kind} data .* --objective grpo reads prompt-only records"
        ):
            check_objective(other, "grpo")
        with pytest.raises(
            DataError, match=f"holds {kind} data, not prompts: GRPO reads prompt-only"
        ):
            PreparedPrompts(other)
    text = tmp_path / "text"
    jsonl(tmp_path / "t.jsonl", [{"text": "the model reads a story"}])
    assert (
        baton_data(
            capsys,
            "prepare",
            tmp_path / "t.jsonl",
            "--tokenizer",
            files["tokenizer"],
            "--output",
            text,
        )[0]
        == 0
    )
    with pytest.raises(
        DataError, match="is pretraining text, but --objective grpo needs prompt-only"
    ):
        check_objective(text, "grpo")
    with pytest.raises(DataError, match="holds pretraining text, not prompts"):
        PreparedPrompts(text)


def test_the_run_checks_tokenizer_and_prompt_length(
    files: dict[str, Path], tmp_path: Path, capsys
) -> None:
    prompts = tmp_path / "prompts"
    source = jsonl(tmp_path / "p.jsonl", TEXT_PROMPTS)
    assert (
        baton_data(
            capsys, "prepare", source, "--tokenizer", files["tokenizer"], "--output", prompts
        )[0]
        == 0
    )
    data = PreparedPrompts(prompts)
    data.check_tokenizer(load_tokenizer(files["tokenizer"]))
    with pytest.raises(DataError, match="was prepared with tokenizer .* but this run uses"):
        data.check_tokenizer(load_tokenizer(files["plain"]))
    with pytest.raises(DataError, match="was prepared with tokenizer"):
        resolve_tokenizer(str(prompts), str(files["plain"]))
    assert resolve_tokenizer(str(prompts), None) == str(files["tokenizer"])
    data.check_prompt_length(data.max_prompt_length)
    lengths = [data.length(i) for i in range(len(data))]
    limit = sorted(lengths)[-2]
    with pytest.raises(DataError) as error:
        data.check_prompt_length(limit)
    longer = sum(length > limit for length in lengths)
    assert str(error.value).startswith(
        f"{longer} of 3 prompts of {prompts} are longer than --max-prompt-length {limit} "
        f"(the longest: {max(lengths)} tokens"
    )
    assert f"pass --max-prompt-length {max(lengths)}" in str(error.value)


BAD = {  # name -> (records, extra arguments, tokenizer, words of the message)
    "a record without a prompt": (
        [TEXT_PROMPTS[0], {"question": "q", "answer": "a"}],
        [],
        "tokenizer",
        ["line 2 has none of the post-training formats' fields (its keys: answer, question)"],
    ),
    "no prompt under --format prompt": (
        [{"question": "q", "answer": "a"}],
        ["--format", "prompt"],
        "tokenizer",
        ["line 1 has no 'prompt' for format prompt"],
    ),
    "a conversation among prompts": (
        [TEXT_PROMPTS[0], {"prompt": "p", "completion": "c"}],
        [],
        "tokenizer",
        ["line 2 is prompt_completion, not a prompt alone"],
    ),
    "text and turns mixed": (
        [TEXT_PROMPTS[0], TURN_PROMPTS[1]],
        [],
        "tokenizer",
        ["line 2: the prompt is a list of turns but at", "line 1 it is text"],
    ),
    "an empty prompt": (
        [{"prompt": "  ", "answer": "1"}],
        [],
        "tokenizer",
        ["the prompt is empty"],
    ),
    "a prompt that is a number": (
        [{"prompt": 7}],
        ["--format", "prompt"],
        "tokenizer",
        ["'prompt' is a int, not text or a list of turns"],
    ),
    "turns out of order": (
        [{"prompt": [{"role": "assistant", "content": "a"}]}],
        [],
        "tokenizer",
        ["turn 0 of 'prompt' is a assistant turn first (roles out of order"],
    ),
    "a column named as an argument": (
        [{"prompt": "p", "completions": "c"}],
        [],
        "tokenizer",
        ["the column 'completions' has the name of a reward function's own argument"],
    ),
    "turns without a chat template": (
        [TURN_PROMPTS[1]],
        [],
        "no template",
        ["has no chat template", "--chat-template"],
    ),
    "packed with --seq-len": (
        [TEXT_PROMPTS[0]],
        ["--seq-len", "64"],
        "tokenizer",
        ["is a prompt alone: prompts (for GRPO) are not packed into rows; leave out --seq-len"],
    ),
    "--format prompt with --seq-len": (
        [TEXT_PROMPTS[0]],
        ["--format", "prompt", "--seq-len", "64"],
        "tokenizer",
        ["prompts (for GRPO) are not packed into rows: leave out --seq-len"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_prompts_are_one_line_and_write_nothing(
    case: str, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records, extra, tokenizer, words = BAD[case]
    if tokenizer == "no template":
        from transformers import AutoTokenizer

        plain = AutoTokenizer.from_pretrained(files["plain"])
        plain.chat_template = None
        plain.save_pretrained(str(tmp_path / "bare"))
        (tmp_path / "bare" / "chat_template.jinja").unlink(missing_ok=True)
        directory = tmp_path / "bare"
    else:
        directory = files[tokenizer]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    source = jsonl(inputs / "in.jsonl", records)
    output = tmp_path / "new" / "out"
    status, out, err = baton_data(
        capsys, "prepare", source, "--tokenizer", directory, "--output", output, *extra
    )
    assert status == 2, out
    assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err
    assert not output.parent.exists()  # nothing written, not even the directory


def test_the_reader_refuses_broken_prompts(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    prefix = tmp_path / "p"
    source = jsonl(tmp_path / "p.jsonl", TEXT_PROMPTS)
    assert (
        baton_data(
            capsys, "prepare", source, "--tokenizer", files["tokenizer"], "--output", prefix
        )[0]
        == 0
    )
    with pytest.raises(DataError, match="no prompts at .*; make them with `baton data prepare"):
        PreparedPrompts(tmp_path / "missing")
    records = records_path(prefix)
    lines = records.read_text(encoding="utf-8")
    records.write_text(lines.split("\n", 1)[1], encoding="utf-8")
    with pytest.raises(DataError, match="has 2 records but .* has 3 prompts; prepare them again"):
        PreparedPrompts(prefix)
    records.unlink()
    with pytest.raises(DataError, match=r"p\.prompts\.jsonl not found"):
        PreparedPrompts(prefix)
    records.write_text(lines, encoding="utf-8")
    manifest_file = Path(f"{prefix}.json")
    manifest = json.loads(manifest_file.read_text())
    manifest_file.write_text(json.dumps({**manifest, "prompts": 4}))
    with pytest.raises(DataError, match="the manifest counts 4 prompts but .* holds 3 sequences"):
        PreparedPrompts(prefix)
    manifest_file.write_text(json.dumps({**manifest, "max_prompt_length": 1}))
    with pytest.raises(DataError, match="the manifest says the longest prompt has 1 tokens"):
        PreparedPrompts(prefix)
    manifest_file.unlink()
    with pytest.raises(DataError, match="not found: .* is not prompts"):
        PreparedPrompts(prefix)
