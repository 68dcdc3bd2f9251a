"""`baton data prepare --seq-len`: conversations and pairs rendered by the chat template,
masked, packed; checked against transformers' apply_chat_template and TRL's tokenization."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from baton.data import TokenizerInfo, train_tokenizer
from baton.data.packed import PackedDataset
from baton.tools.data.chat import ChatTokenizer
from baton.tools.data.cli import main
from baton.tools.data.packing import best_fit_decreasing

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_GENERATION = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CONVERSATIONS = [
    [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "What is a list in Python?"},
        {"role": "assistant", "content": "A mutable sequence."},
        {"role": "user", "content": "And a tuple?"},
        {"role": "assistant", "content": "An immutable one."},
    ],
    [
        {"role": "user", "content": "Name a keyword."},
        {"role": "assistant", "content": "lambda"},
    ],
    [
        {"role": "user", "content": "How do I define a function that returns nothing at all?"},
        {"role": "assistant", "content": "Write def f(): pass and call it; it returns None."},
    ],
]
PAIRS = [
    {"prompt": "The keyword for a loop is", "chosen": " for", "rejected": " loop"},
    {"prompt": "def add(a, b): return", "chosen": " a + b", "rejected": " a - b"},
    {"prompt": "A dict maps", "chosen": " keys to values.", "rejected": " nothing at all."},
]


def chat_tokenizer(directory: Path, template: str | None) -> Path:
    """A small byte-level BPE with ChatML's special tokens and ``template``."""
    from transformers import AutoTokenizer

    train_tokenizer(directory, vocab_size=400)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat-tokenizers")
    return {
        "chatml": chat_tokenizer(root / "chatml", CHATML),
        "generation": chat_tokenizer(root / "generation", CHATML_GENERATION),
        "none": chat_tokenizer(root / "none", None),
        # a header counting the turns: a prefix of the conversation is no prefix of it
        "counting": chat_tokenizer(root / "counting", "{{ messages | length }} turns\n" + CHATML),
    }


def jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def prepare(capsys, *argv: str | Path) -> tuple[int, str, str]:
    status = main(["prepare", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def reference(directory: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def test_assistant_masks_match_the_template(tokenizers: dict[str, Path]) -> None:
    plain, marked = reference(tokenizers["chatml"]), reference(tokenizers["generation"])
    prefix_spans = ChatTokenizer.load(tokenizers["chatml"])
    generation = ChatTokenizer.load(tokenizers["generation"])
    assert (prefix_spans.marks_generation, generation.marks_generation) == (False, True)
    for turns in CONVERSATIONS:
        expected = plain.apply_chat_template(turns, tokenize=True, return_dict=True)["input_ids"]
        ids, mask = prefix_spans.messages(turns, "assistant")
        assert ids == list(expected)
        # the spans found from prefixes are each assistant turn, end of turn included
        spans = "".join(plain.decode([t for t, m in zip(ids, mask, strict=True) if m]))
        answers = [turn["content"] for turn in turns if turn["role"] == "assistant"]
        assert spans == "".join(f"{answer}<|im_end|>\n" for answer in answers)
        # {% generation %}: transformers' own assistant mask
        output = marked.apply_chat_template(
            turns, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids, mask = generation.messages(turns, "assistant")
        assert (ids, mask) == (list(output["input_ids"]), list(output["assistant_masks"]))
        assert ids == list(expected)  # the same text, so the same ids
        # the last assistant turn only; every token
        _, last = generation.messages(turns, "last_assistant")
        assert marked.decode([t for t, m in zip(ids, last, strict=True) if m]) == (
            f"{answers[-1]}<|im_end|>"
        )
        assert generation.messages(turns, "all") == (ids, [1] * len(ids))


def test_conversations_together_as_one_at_a_time(tokenizers: dict[str, Path]) -> None:
    """Many conversations at once give each the ids and mask it gets alone, one that goes
    on after its last assistant turn included."""
    talks = [*CONVERSATIONS, [*CONVERSATIONS[1], {"role": "user", "content": "Another?"}]]
    for name in ("chatml", "generation"):
        chat = ChatTokenizer.load(tokenizers[name])
        for mask in ("assistant", "last_assistant", "all"):
            alone = [chat.messages(turns, mask) for turns in talks]
            assert chat.conversations(talks, mask) == alone


def test_prefixes_render_as_apply_chat_template(tokenizers: dict[str, Path]) -> None:
    """The prefix renderer gives each prefix, with and without the generation prompt,
    exactly as apply_chat_template renders it."""
    from baton.tools.data.prefixes import PrefixRenderer

    for name in ("chatml", "counting"):
        chat = ChatTokenizer.load(tokenizers[name])
        renderer = PrefixRenderer.load(chat.tokenizer)
        assert renderer is not None
        for turns in CONVERSATIONS:
            cuts = [(count, prompt) for count in range(1, len(turns) + 1) for prompt in (0, 1)]
            expected = [
                chat.tokenizer.apply_chat_template(
                    turns[:count], tokenize=False, add_generation_prompt=bool(prompt)
                )
                for count, prompt in cuts
            ]
            assert renderer.render(turns, [(c, bool(p)) for c, p in cuts]) == expected


def test_byte_edges_are_the_offsets(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    """From the ids alone, a byte-level BPE's token edges are those its offsets give, on
    text whose characters the tokens split; a tokenizer of another kind gets none."""
    import bisect

    from tokenizers import SentencePieceBPETokenizer

    from baton.tools.data.byte_edges import ByteEdges

    backend = reference(tokenizers["chatml"]).backend_tokenizer
    edges = ByteEdges.load(backend)
    assert edges is not None
    text = "<|im_start|>user\nnaïve café 日本語 😀🚀 x<|im_end|>\n  tabs\tend "
    encoding = backend.encode(text, add_special_tokens=False)
    found, other_text = edges.of([text, text + "!"], [encoding.ids, encoding.ids])
    assert found is not None and other_text is None  # the ids do not tile that text
    starts = [start for start, _ in encoding.offsets]
    for position in range(len(text) + 1):
        token = bisect.bisect_left(starts, position)
        crosses = token > 0 and encoding.offsets[token - 1][1] > position
        assert found.edge(position) == (token, crosses), position
    other = SentencePieceBPETokenizer()
    other.train_from_iterator([text] * 4, vocab_size=60)
    assert ByteEdges.load(other._tokenizer) is None


def test_a_failing_record_among_many_is_named(
    tokenizers: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """Conversations are rendered together; the one the template fails on is still named."""
    template = tmp_path / "picky.jinja"
    template.write_text(
        "{% for message in messages %}{% if message['content'] == 'lambda' %}"
        "{{ raise_exception('no lambdas') }}{% endif %}{% endfor %}" + CHATML
    )
    records = [{"messages": CONVERSATIONS[0]}, {"messages": CONVERSATIONS[2]}]
    source = jsonl(tmp_path / "in.jsonl", [*records, {"messages": CONVERSATIONS[1]}, *records])
    status, _, err = prepare(
        capsys, source, "--tokenizer", tokenizers["chatml"], "--output", tmp_path / "out" / "p",
        "--seq-len", "256", "--chat-template", template,
    )  # fmt: skip
    assert status == 2
    assert "line 3: the chat template" in err and "no lambdas" in err, err
    assert not (tmp_path / "out").exists()


def test_pairs_tokenize_as_trl_dpo(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    """The same ids and completion masks as TRL's DPOTrainer dataset preparation."""
    import datasets
    from trl import DPOConfig, DPOTrainer

    tokenizer = reference(tokenizers["chatml"])
    conversational = [
        {
            "prompt": [{"role": "user", "content": pair["prompt"]}],
            "chosen": [{"role": "assistant", "content": pair["chosen"]}],
            "rejected": [{"role": "assistant", "content": pair["rejected"]}],
        }
        for pair in PAIRS
    ]
    chat = ChatTokenizer.load(tokenizers["chatml"])
    config = DPOConfig(
        output_dir=str(tmp_path / "trl"), max_length=None, report_to=[], use_cpu=True, bf16=False
    )
    for records in (PAIRS, conversational):
        trainer = SimpleNamespace(_tokenizer=tokenizer)  # all _prepare_dataset reads of self
        trl = DPOTrainer._prepare_dataset(
            trainer,  # type: ignore[arg-type]
            datasets.Dataset.from_list(records),
            tokenizer,
            config,
            "train",
        )
        for record, expected in zip(records, trl, strict=True):
            chosen, rejected = chat.pair(record["prompt"], record["chosen"], record["rejected"])
            prompt = expected["prompt_ids"]
            for side, (ids, mask) in (("chosen", chosen), ("rejected", rejected)):
                assert ids == prompt + expected[f"{side}_ids"]
                assert mask == [0] * len(prompt) + [1] * len(expected[f"{side}_ids"])
    # plain strings end with the end-of-sequence token, as TRL appends it
    (ids, _), _ = chat.pair(**PAIRS[0])
    assert ids[-1] == tokenizer.eos_token_id


def test_prompt_completion_masks_the_completion(tokenizers: dict[str, Path]) -> None:
    tokenizer = reference(tokenizers["chatml"])
    chat = ChatTokenizer.load(tokenizers["chatml"])
    prompt = [{"role": "user", "content": "Name a keyword."}]
    completion = [{"role": "assistant", "content": "yield"}]
    ids, mask = chat.prompt_completion(prompt, completion)
    full = tokenizer.apply_chat_template(prompt + completion, tokenize=True, return_dict=True)
    head = tokenizer.apply_chat_template(
        prompt, tokenize=True, return_dict=True, add_generation_prompt=True
    )
    assert ids == list(full["input_ids"])
    assert mask == [0] * len(head["input_ids"]) + [1] * (len(ids) - len(head["input_ids"]))
    ids, mask = chat.prompt_completion("x = ", "1")
    assert ids == tokenizer("x = 1" + tokenizer.eos_token)["input_ids"]
    assert tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]) == (
        "1" + tokenizer.eos_token
    )


def test_best_fit_decreasing() -> None:
    assert best_fit_decreasing([5, 3, 4, 2, 6], capacity=8) == [[4, 3], [0, 1], [2]]
    lengths = [7, 1, 3, 8, 2, 5, 5, 4, 6, 1]
    rows = best_fit_decreasing(lengths, capacity=10)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 10 for row in rows)
    assert len(rows) == 5  # 42 tokens: the fewest rows of 10 that can hold them


def test_packing_fills_rows_at_least_as_well_as_trl() -> None:
    """On a spread of conversation lengths, as many or fewer rows than TRL's own
    best-fit-decreasing ``pack_dataset`` (which packs each batch of 1000 on its own)."""
    import datasets
    import numpy as np
    from trl.data_utils import pack_dataset

    rng = np.random.default_rng(0)
    capacity = 2048
    lengths = np.clip(rng.lognormal(5.5, 0.9, size=3000).astype(int), 8, capacity).tolist()
    ours = best_fit_decreasing(lengths, capacity)
    dataset = datasets.Dataset.from_dict({"input_ids": [[1] * length for length in lengths]})
    theirs = pack_dataset(dataset, seq_length=capacity, strategy="bfd")
    assert sum(len(row) for row in theirs["input_ids"]) == sum(lengths)  # nothing cut
    assert len(ours) <= len(theirs)
    fill = sum(lengths) / (len(ours) * capacity)
    assert fill > 0.95, fill


def test_prepare_messages_packs_and_masks(
    tokenizers: dict[str, Path], tmp_path: Path, capsys
) -> None:
    records = [{"messages": turns} for turns in CONVERSATIONS * 4]
    source = jsonl(tmp_path / "chat.jsonl", records)
    status, out, err = prepare(
        capsys, source, "--tokenizer", tokenizers["generation"], "--output", tmp_path / "out/chat",
        "--seq-len", "96",
    )  # fmt: skip
    assert (status, err) == (0, "")
    assert "fill" in out and "rows of 97" in out
    data = PackedDataset(tmp_path / "out/chat")
    manifest = data.manifest
    assert (data.objective, manifest["input_format"], manifest["mask"]) == (
        "sft",
        "messages",
        "assistant",
    )
    assert manifest["template"]["source"] == "tokenizer"
    assert manifest["packing"]["method"] == "best_fit_decreasing"
    assert manifest["packing"]["fill"] == manifest["tokens"] / (data.num_rows * 97)
    chat = ChatTokenizer.load(tokenizers["generation"])
    expected = sorted(
        (tuple(ids), tuple(mask)) for ids, mask in (chat.messages(r["messages"]) for r in records)
    )
    found = []
    for row in range(data.num_rows):
        documents = data.row(row)
        assert sum(len(tokens) for tokens, _ in documents) <= 97
        for tokens, mask in documents:
            assert mask[0] == 0
            found.append((tuple(tokens.tolist()), (0, *mask[1:].tolist())))
    assert sorted(found) == sorted((ids, (0, *mask[1:])) for ids, mask in expected)
    assert len(found) == len(records)


def test_prepare_pairs_keeps_each_pair_in_one_row(
    tokenizers: dict[str, Path], tmp_path: Path, capsys
) -> None:
    source = jsonl(tmp_path / "pairs.jsonl", PAIRS * 3)
    status, _, err = prepare(
        capsys, source, "--tokenizer", tokenizers["chatml"], "--output", tmp_path / "pairs",
        "--seq-len", "40",
    )  # fmt: skip
    assert (status, err) == (0, "")
    data = PackedDataset(tmp_path / "pairs")
    assert (data.objective, data.manifest["mask"], data.manifest["template"]) == (
        "preference",
        "completion",
        None,  # plain strings: no chat template rendered them
    )
    chat = ChatTokenizer.load(tokenizers["chatml"])
    expected = {}
    for pair in PAIRS:
        chosen, rejected = chat.pair(**pair)
        expected[tuple(chosen[0])] = tuple(rejected[0])
    pairs = 0
    for row in range(data.num_rows):
        documents = data.row(row)
        assert len(documents) % 2 == 0
        for chosen, rejected in zip(documents[::2], documents[1::2], strict=True):
            assert expected[tuple(chosen[0].tolist())] == tuple(rejected[0].tolist())
            pairs += 1
    assert pairs == 9


def test_truncate_cuts_and_counts(tokenizers: dict[str, Path], tmp_path: Path, capsys) -> None:
    source = jsonl(tmp_path / "chat.jsonl", [{"messages": turns} for turns in CONVERSATIONS])
    common = [source, "--tokenizer", tokenizers["chatml"], "--seq-len", "24"]
    status, _, err = prepare(capsys, *common, "--output", tmp_path / "a")
    assert status == 2 and "--truncate" in err and "the longest:" in err
    assert len(err.strip().splitlines()) == 1
    status, _, err = prepare(capsys, *common, "--output", tmp_path / "b", "--truncate")
    assert (status, err) == (0, "")
    data = PackedDataset(tmp_path / "b")
    assert data.manifest["truncated"] >= 2
    assert all(sum(len(t) for t, _ in data.row(r)) <= 25 for r in range(data.num_rows))


def test_truncate_pairs(tokenizers: dict[str, Path], tmp_path: Path, capsys) -> None:
    """Both sides of a long pair are cut to share one row; a pair whose prompt alone fills
    its share has nothing left to score and is dropped (counted)."""
    long_answer = {"prompt": "Say it:", "chosen": " yes" * 30, "rejected": " no" * 5}
    long_prompt = {"prompt": "word " * 200, "chosen": " a", "rejected": " b"}
    source = jsonl(tmp_path / "pairs.jsonl", [long_answer, long_prompt, PAIRS[0]])
    (chosen, _), (rejected, _) = ChatTokenizer.load(tokenizers["chatml"]).pair(**PAIRS[0])
    capacity = len(chosen) + len(rejected)  # PAIRS[0] just fits
    status, _, err = prepare(
        capsys, source, "--tokenizer", tokenizers["chatml"], "--output", tmp_path / "p",
        "--seq-len", capacity - 1, "--truncate",
    )  # fmt: skip
    assert (status, err) == (0, "")
    data = PackedDataset(tmp_path / "p")
    manifest = data.manifest
    assert (manifest["truncated"], manifest["dropped_without_targets"]) == (2, 1)
    assert data.num_sequences == 4  # two pairs left
    for row in range(data.num_rows):
        documents = data.row(row)
        assert sum(len(tokens) for tokens, _ in documents) <= capacity
        assert all(mask.any() for _, mask in documents)


PAIR = {"prompt": "p", "chosen": "a", "rejected": "b"}
BAD = {  # name -> (records, extra arguments, tokenizer, words of the message)
    "no assistant turn": (
        [{"messages": [{"role": "user", "content": "hi"}]}],
        [],
        "chatml",
        ["line 1", "no assistant turn"],
    ),
    "roles out of order": (
        [{"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}]}],
        [],
        "chatml",
        ["roles out of order"],
    ),
    "no chat template": (
        [{"messages": CONVERSATIONS[1]}],
        [],
        "none",
        ["has no chat template", "--chat-template"],
    ),
    "empty completion": (
        [{"prompt": "p", "completion": "  "}],
        [],
        "chatml",
        ["completion is empty"],
    ),
    "chosen equals rejected": (
        [{"prompt": "p", "chosen": "same", "rejected": "same"}],
        [],
        "chatml",
        ["chosen equals rejected"],
    ),
    "document longer than a row": (
        [{"messages": CONVERSATIONS[0]}, {"messages": CONVERSATIONS[2]}],
        ["--seq-len", "8"],
        "chatml",
        ["2 documents are longer than a row", "--truncate"],
    ),
    "two formats": (
        [{"messages": CONVERSATIONS[1]}, PAIR],
        [],
        "chatml",
        ["line 2 is preference", "two formats"],
    ),
    "template prefixes differ": (
        [{"messages": CONVERSATIONS[1]}],
        [],
        "counting",
        ["does not render the conversation up to turn 1 as a prefix", "{% generation %}"],
    ),
    "no seq-len": ([{"messages": CONVERSATIONS[1]}], [None], "chatml", ["--seq-len"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input(case: str, tokenizers: dict[str, Path], tmp_path: Path, capsys) -> None:
    records, extra, tokenizer, words = BAD[case]
    source = jsonl(tmp_path / "in.jsonl", records)
    seq_len = [] if extra == [None] else (extra or ["--seq-len", "128"])
    output = tmp_path / "new" / "out"
    status, out, err = prepare(
        capsys, source, "--tokenizer", tokenizers[tokenizer], "--output", output, *seq_len
    )
    assert status == 2, out
    assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err
    assert not output.parent.exists()  # nothing written, not even the directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_chat_template_file(tokenizers: dict[str, Path], tmp_path: Path, capsys) -> None:
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML, encoding="utf-8")
    source = jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[1]}])
    status, _, err = prepare(
        capsys, source, "--tokenizer", tokenizers["none"], "--output", tmp_path / "c",
        "--seq-len", "64", "--chat-template", template, "--mask", "all",
    )  # fmt: skip
    assert (status, err) == (0, "")
    data = PackedDataset(tmp_path / "c")
    assert data.manifest["template"]["source"] == str(template)
    assert data.manifest["mask"] == "all"
    (tokens, mask), = data.row(0)  # fmt: skip
    assert mask.tolist() == [0] + [1] * (len(tokens) - 1)


def test_parquet_and_saved_dataset(tokenizers: dict[str, Path], tmp_path: Path, capsys) -> None:
    import datasets

    records = [{"messages": turns} for turns in CONVERSATIONS]
    dataset = datasets.Dataset.from_list(records)
    dataset.to_parquet(str(tmp_path / "chat.parquet"))
    dataset.save_to_disk(str(tmp_path / "saved"))
    jsonl(tmp_path / "chat.jsonl", records)
    capsys.readouterr()  # the datasets library's progress bars
    tokens = []
    for name in ("chat.jsonl", "chat.parquet", "saved"):
        status, _, err = prepare(
            capsys, tmp_path / name, "--tokenizer", tokenizers["chatml"],
            "--output", tmp_path / f"out-{name}", "--seq-len", "128",
        )  # fmt: skip
        assert (status, err) == (0, "")
        tokens.append(Path(f"{tmp_path}/out-{name}.bin").read_bytes())
    assert tokens[0] == tokens[1] == tokens[2]
    # every column in every row: a null field is absent, so formats are told apart per row
    nulls: list[str | None] = [None] * len(records)
    mixed = datasets.Dataset.from_dict(
        {
            "messages": [*CONVERSATIONS, None],
            "prompt": [*nulls, "p"],
            "completion": [*nulls, "c"],
        }
    )
    mixed.to_parquet(str(tmp_path / "mixed.parquet"))
    capsys.readouterr()
    status, _, err = prepare(
        capsys, tmp_path / "mixed.parquet", "--tokenizer", tokenizers["chatml"],
        "--output", tmp_path / "mixed", "--seq-len", "128",
    )  # fmt: skip
    assert status == 2 and "row 4 is prompt_completion but" in err and "row 1 is messages" in err


def test_text_without_seq_len_refuses_conversations(
    tokenizer: TokenizerInfo, tmp_path: Path, capsys
) -> None:
    source = jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[1]}])
    status, _, err = prepare(
        capsys, source, "--tokenizer", tokenizer.path, "--output", tmp_path / "o"
    )
    assert status == 2 and "--seq-len" in err
