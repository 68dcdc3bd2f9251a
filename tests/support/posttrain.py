"""Post-training fixtures shared by every engine's tests: a chat tokenizer, a tiny model,
small packed SFT and preference datasets, and the references outside baton that an
engine's first step must equal (``transformers`` for SFT, TRL's ``DPOTrainer`` for DPO).

    tok = chat_tokenizer(tmp_path / "tok")
    model = tiny_model(tmp_path / "model")                     # vocab 512 >= the tokenizer's
    sft = sft_prefix(tmp_path / "data", tok, seq_len=96)       # rows of 2-4 conversations
    loss, grad_norm = sft_reference(model, sft, rows=[0, 1])

    pairs = preference_prefix(tmp_path / "pairs", tok, seq_len=96)
    ref = tiny_model(tmp_path / "ref", seed=1)                 # differs from the policy
    trl = dpo_reference(model, ref, pairs, rows=[0, 1], beta=0.1, loss_type="sigmoid")
    trl["loss"], trl["rewards/margins"], trl["logps/chosen"]

    files = posttrain_files(tmp_path, seq_len=96)              # all of the above at once
    files["tokenizer"], files["policy"], files["reference"], files["sft"], files["pairs"]

    logged = LoggedMetrics()                                   # the engine's side
    driver.callbacks.append(logged); driver.fit()
    logged.metrics[1]["loss"]                                  # step 1's logged metrics

Token ids of the preference pairs are TRL's own: ``preference_prefix`` tokenizes each
conversational pair with TRL's ``_tokenize`` (``apply_chat_template``) and splits prompt
from completion with TRL's ``common_prefix_length``, as ``DPOTrainer`` does (TRL 1.16 has
no way to take pre-tokenized pairs: it always tokenizes ``prompt``/``chosen``/``rejected``
itself). ``dpo_reference`` then gives TRL the same pairs as messages and checks that the
ids TRL tokenized are the ids of the dataset's documents before it computes anything.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from baton.core import Callback

#: the special tokens of the chat template (added to the trained BPE)
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
#: a ChatML template whose assistant turns are marked with ``{% generation %}``
#: (``apply_chat_template(return_assistant_tokens_mask=True)`` marks their tokens)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: the words every conversation (and the tokenizer's training text) is made of
WORDS = (
    "the model reads a short story about rivers and mountains then answers each question "
    "with care because small tests need clear data so every turn stays brief while the "
    "assistant explains how trains run through cities at night under bright stars and "
    "why cats sleep all day near warm windows in winter"
).split()
#: Model vocabulary of ``tiny_model``: above the chat tokenizer's
MODEL_VOCAB = 512


class LoggedMetrics(Callback):
    """Every log step's metrics, ``metrics[step][name]`` (each step with ``--log-every 1``;
    a step logged twice, replayed after a rollback, keeps its later metrics): how a test
    reads an engine's first-step loss and metrics. ``logged`` has every ``(step,
    metrics)`` in the order logged."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.logged: list[tuple[int, dict[str, float]]] = []

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.metrics[driver.step] = dict(metrics)
        self.logged.append((driver.step, dict(metrics)))


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def chat_tokenizer(directory: str | Path) -> Path:
    """A small byte-level BPE (``baton.data.train_tokenizer``) with ``<|im_start|>`` and
    ``<|im_end|>`` as special tokens and :data:`CHAT_TEMPLATE` in its tokenizer_config.json;
    ``<|endoftext|>`` is its end-of-document token, ``<|pad|>`` its padding token."""
    from transformers import AutoTokenizer

    from baton.data import train_tokenizer

    rng = random.Random(0)
    texts = [_sentence(rng, 4, 16) for _ in range(400)]
    train_tokenizer(directory, vocab_size=384, texts=texts)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.add_tokens([IM_START, IM_END], special_tokens=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return Path(directory)


def tiny_model(
    directory: str | Path, family: str = "llama", vocab_size: int = MODEL_VOCAB, seed: int = 0
) -> Path:
    """A randomly initialised fp32 ``save_pretrained`` model (2 layers, hidden 64) of
    ``family`` ("llama", "qwen3" or "qwen3_moe": 4 experts, top 2), for ``--init-from``;
    ``seed`` picks the weights."""
    from support.tiny_llama import save_tiny_llama
    from support.tiny_qwen3 import save_tiny_qwen3

    if family == "llama":
        return save_tiny_llama(Path(directory), vocab_size=vocab_size, seed=seed)
    if family in ("qwen3", "qwen3_moe"):
        moe = family == "qwen3_moe"
        return save_tiny_qwen3(Path(directory), moe=moe, vocab_size=vocab_size, seed=seed)
    raise ValueError(f"family {family!r}: use 'llama', 'qwen3' or 'qwen3_moe'")


def _conversation(rng: random.Random) -> list[dict[str, str]]:
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": _sentence(rng, 2, 4)})
    for _ in range(rng.choice((1, 1, 2))):
        messages.append({"role": "user", "content": _sentence(rng, 2, 6)})
        messages.append({"role": "assistant", "content": _sentence(rng, 2, 8)})
    return messages


def conversations(count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """``count`` short conversations (an optional system turn, one or two user/assistant
    exchanges) as TRL's ``messages`` format."""
    rng = random.Random(seed)
    return [_conversation(rng) for _ in range(count)]


def preference_pairs(count: int, seed: int = 0) -> list[dict[str, list[dict[str, str]]]]:
    """``count`` conversational pairs in TRL's format: ``{"prompt": [...], "chosen":
    [assistant turn], "rejected": [another assistant turn]}`` (chosen != rejected)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        prompt = [{"role": "user", "content": _sentence(rng, 2, 6)}]
        chosen = _sentence(rng, 2, 8)
        rejected = chosen
        while rejected == chosen:
            rejected = _sentence(rng, 2, 8)
        pairs.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
    return pairs


def _load_hf_tokenizer(tokenizer_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def sft_document(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """A conversation's token ids and its assistant-only target mask (transformers'
    ``return_assistant_tokens_mask``; the first token is never a target)."""
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = list(encoded["input_ids"]), list(encoded["assistant_masks"])
    mask[0] = 0
    return ids, mask


def trl_pair_ids(tokenizer: Any, pair: dict[str, Any]) -> tuple[list[int], list[int], list[int]]:
    """``(prompt_ids, chosen_ids, rejected_ids)`` of a conversational pair, tokenized as
    TRL 1.16's ``DPOTrainer`` does (its ``_tokenize`` and ``common_prefix_length``)."""
    from trl.data_utils import _tokenize, common_prefix_length

    prompt = _tokenize(tokenizer, pair["prompt"], add_generation_prompt=True)["input_ids"]
    chosen = _tokenize(tokenizer, pair["prompt"] + pair["chosen"])["input_ids"]
    rejected = _tokenize(tokenizer, pair["prompt"] + pair["rejected"])["input_ids"]
    start = min(common_prefix_length(prompt, chosen), common_prefix_length(prompt, rejected))
    return list(prompt[:start]), list(chosen[start:]), list(rejected[start:])


def _pack(
    items: Sequence[list[tuple[list[int], list[int]]]], capacity: int, per_row: tuple[int, int]
) -> list[list[tuple[list[int], list[int]]]]:
    """Consecutive groups of documents packed in order into rows of at most ``capacity``
    tokens and ``per_row`` (low, high) documents; a group (a pair) stays in one row."""
    rows: list[list[tuple[list[int], list[int]]]] = []
    row: list[tuple[list[int], list[int]]] = []
    for group in items:
        size = sum(len(tokens) for tokens, _ in group)
        if size > capacity:
            continue
        used = sum(len(tokens) for tokens, _ in row)
        if row and (used + size > capacity or len(row) + len(group) > per_row[1]):
            if len(row) >= per_row[0]:
                rows.append(row)
            row = []
        row = [*row, *group]
    if len(row) >= per_row[0]:
        rows.append(row)
    return rows


def _write(
    prefix: Path, rows: list, objective: str, seq_len: int, tokenizer_dir: Any, **fields: Any
) -> Path:
    from baton.data import load_tokenizer
    from baton.data.packed import write_packed

    prefix.parent.mkdir(parents=True, exist_ok=True)
    write_packed(
        prefix, rows, objective=objective, seq_len=seq_len,
        tokenizer=load_tokenizer(tokenizer_dir), **fields,
    )  # fmt: skip
    return prefix


def sft_prefix(
    directory: str | Path, tokenizer_dir: str | Path, seq_len: int, num_rows: int = 8
) -> Path:
    """The prefix of a small packed SFT dataset (``directory/sft``): ``num_rows`` rows of
    2-4 conversations each, assistant-only masks, written with ``write_packed``."""
    tokenizer = _load_hf_tokenizer(tokenizer_dir)
    rows: list = []
    seed = 0
    while len(rows) < num_rows:
        chats = conversations(8 * num_rows, seed=seed)
        docs = [[sft_document(tokenizer, messages)] for messages in chats]
        rows += _pack(docs, seq_len + 1, (2, 4))
        seed += 1
    return _write(
        Path(directory) / "sft", rows[:num_rows], "sft", seq_len, tokenizer_dir,
        input_format="messages", mask="assistant",
    )  # fmt: skip


def preference_documents(tokenizer: Any, pair: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    """A pair as two documents, chosen then rejected: TRL's ids of prompt + completion,
    the mask marking the completion's tokens."""
    prompt, chosen, rejected = trl_pair_ids(tokenizer, pair)
    return [
        (prompt + completion, [0] * len(prompt) + [1] * len(completion))
        for completion in (chosen, rejected)
    ]


def preference_prefix(
    directory: str | Path, tokenizer_dir: str | Path, seq_len: int, num_rows: int = 8
) -> Path:
    """The prefix of a small packed preference dataset (``directory/pairs``): ``num_rows``
    rows of one or two pairs (chosen, rejected) each, tokenized as TRL does
    (``preference_documents``) from ``preference_pairs``."""
    tokenizer = _load_hf_tokenizer(tokenizer_dir)
    count = 4 * num_rows
    pairs = preference_pairs(count)
    rows = _pack([preference_documents(tokenizer, p) for p in pairs], seq_len + 1, (2, 4))
    if len(rows) < num_rows:
        raise ValueError(f"seq_len {seq_len} holds too few pairs; use a larger seq_len")
    return _write(
        Path(directory) / "pairs", rows[:num_rows], "preference", seq_len, tokenizer_dir,
        input_format="preference", mask="completion",
    )  # fmt: skip


def posttrain_files(
    root: str | Path,
    seq_len: int,
    num_rows: int = 8,
    kinds: Sequence[str] = ("sft", "pairs"),
    family: str = "llama",
) -> dict[str, Path]:
    """The files an engine's post-training tests read, under ``root``: ``tokenizer`` (the
    chat tokenizer), ``policy`` and ``reference`` (tiny models of ``family``, seeds 0 and
    1), and for
    each of ``kinds`` its packed prefix of ``num_rows`` rows of ``seq_len``: ``sft``
    (conversations) and ``pairs`` (preference pairs)."""
    root = Path(root)
    tokenizer = chat_tokenizer(root / "tok")
    files = {
        "tokenizer": tokenizer,
        "policy": tiny_model(root / "policy", family),
        "reference": tiny_model(root / "reference", family, seed=1),
    }
    write = {"sft": sft_prefix, "pairs": preference_prefix}
    for kind in kinds:
        files[kind] = write[kind](root / "data", tokenizer, seq_len, num_rows)
    return files


def _documents(prefix: str | Path, rows: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    from baton.data.packed import PackedDataset

    data = PackedDataset(str(prefix))
    return [
        ([int(t) for t in tokens], [int(m) for m in mask])
        for r in rows
        for tokens, mask in data.row(r)
    ]


def _load_model(model_dir: str | Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.train()  # tiny models have no dropout: train mode only matters for autograd


def sft_reference_documents(
    model_dir: str | Path, documents: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> tuple[float, float]:
    """``(loss, grad_norm)`` of ``transformers`` on each document alone, unpacked, with
    labels -100 where the mask is 0: loss = the sum of cross entropy over all supervised
    targets / their count; grad_norm = the 2-norm of that loss's gradient over all
    parameters."""
    import torch

    model = _load_model(model_dir)
    total = sum(int(sum(mask)) for _, mask in documents)
    loss = torch.zeros((), dtype=torch.float64)
    for tokens, mask in documents:
        ids = torch.tensor([list(tokens)])
        labels = ids.masked_fill(torch.tensor([list(mask)]) == 0, -100)
        # transformers sums the token losses and divides by num_items_in_batch
        part = model(input_ids=ids, labels=labels, num_items_in_batch=total).loss
        part.backward()
        loss += part.detach().double()
    grads = [p.grad.double().flatten() for p in model.parameters() if p.grad is not None]
    return float(loss), float(torch.cat(grads).norm())


def sft_reference(
    model_dir: str | Path, prefix: str | Path, rows: Sequence[int]
) -> tuple[float, float]:
    """``(loss, grad_norm)`` of ``transformers`` on every document of ``rows`` of the
    packed SFT dataset at ``prefix``, each on its own (:func:`sft_reference_documents`)."""
    return sft_reference_documents(model_dir, _documents(prefix, rows))


#: the metrics ``dpo_reference`` returns besides "loss" (TRL's names)
DPO_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def pairs_of_documents(
    documents: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> list[dict[str, list[int]]]:
    """Consecutive (chosen, rejected) documents as TRL's tokenized pairs
    ``{"prompt_ids", "chosen_ids", "rejected_ids"}`` (the prompt is where the mask is 0)."""
    pairs = []
    for (chosen, chosen_mask), (rejected, rejected_mask) in zip(
        documents[0::2], documents[1::2], strict=True
    ):
        start = list(chosen_mask).index(1)
        assert list(rejected_mask).index(1) == start and list(chosen[:start]) == list(
            rejected[:start]
        )
        pairs.append(
            {
                "prompt_ids": list(chosen[:start]),
                "chosen_ids": list(chosen[start:]),
                "rejected_ids": list(rejected[start:]),
            }
        )
    return pairs


def dpo_reference_pairs(
    policy_dir: str | Path,
    reference_dir: str | Path,
    tokenizer_dir: str | Path,
    pairs: Sequence[dict[str, Any]],
    beta: float,
    loss_type: str,
    expected_ids: Sequence[dict[str, list[int]]] | None = None,
) -> dict[str, float]:
    """TRL's ``DPOTrainer`` (CPU, fp32, no precomputed reference) on conversational
    ``pairs``, all in one batch: its first-step loss and metrics. ``expected_ids``, if
    given, must equal the ids TRL tokenized (``pairs_of_documents``), pair by pair."""
    import tempfile

    import datasets
    from trl.trainer.dpo_config import DPOConfig
    from trl.trainer.dpo_trainer import DPOTrainer

    tokenizer = _load_hf_tokenizer(tokenizer_dir)
    with tempfile.TemporaryDirectory() as output:
        config = DPOConfig(
            output_dir=output,
            beta=beta,
            loss_type=[loss_type],
            per_device_train_batch_size=len(pairs),
            max_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=False,
            fp16=False,
            precompute_ref_log_probs=False,
            dataloader_num_workers=0,
            save_strategy="no",
        )
        trainer = DPOTrainer(
            model=_load_model(policy_dir),
            ref_model=_load_model(reference_dir).eval(),
            args=config,
            train_dataset=datasets.Dataset.from_list(list(pairs)),
            processing_class=tokenizer,
        )
        if expected_ids is not None:
            rows: Any = trainer.train_dataset  # a datasets.Dataset of dict rows
            tokenized = [
                {key: list(row[key]) for key in ("prompt_ids", "chosen_ids", "rejected_ids")}
                for row in rows
            ]
            if tokenized != list(expected_ids):
                raise AssertionError("TRL tokenized the pairs differently from the dataset")
        batch = next(iter(trainer.get_train_dataloader()))
        model: Any = trainer.model
        model.train()
        loss = trainer.compute_loss(model, batch)
        logged = trainer._metrics["train"]
        metrics = {name: logged[name][-1] for name in (*DPO_METRICS, "aux_loss") if name in logged}
    return {"loss": float(loss.detach()), **{k: float(v) for k, v in metrics.items()}}


def _pairs_behind(
    tokenizer: Any, documents: Sequence[tuple[Sequence[int], Sequence[int]]], count: int
) -> list[dict[str, Any]]:
    """The conversational pairs (TRL's format) whose chosen documents are ``documents[0::2]``
    (``preference_pairs`` regenerated: its first pairs do not depend on ``count``)."""
    by_ids = {}
    for pair in preference_pairs(count):
        chosen, _ = preference_documents(tokenizer, pair)[0]
        by_ids[tuple(chosen)] = pair
    return [by_ids[tuple(tokens)] for tokens, _ in documents[0::2]]


def dpo_reference(
    policy_dir: str | Path,
    reference_dir: str | Path,
    prefix: str | Path,
    rows: Sequence[int],
    beta: float = 0.1,
    loss_type: str = "sigmoid",
) -> dict[str, float]:
    """TRL's ``DPOTrainer`` first-step loss and metrics (``DPO_METRICS``) on the pairs of
    ``rows`` of the packed preference dataset at ``prefix`` (``preference_prefix``), the
    policy at ``policy_dir`` and the reference model at ``reference_dir``. TRL is given the
    pairs as messages; the ids it tokenizes are checked to equal the dataset's documents."""
    from baton.data.packed import PackedDataset

    data = PackedDataset(str(prefix))
    tokenizer_dir = data.manifest["tokenizer"]["path"]
    documents = _documents(prefix, rows)
    pairs = _pairs_behind(_load_hf_tokenizer(tokenizer_dir), documents, 4 * data.num_rows)
    return dpo_reference_pairs(
        policy_dir,
        reference_dir,
        tokenizer_dir,
        pairs,
        beta,
        loss_type,
        expected_ids=pairs_of_documents(documents),
    )
