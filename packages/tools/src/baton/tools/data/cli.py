"""``baton data``: make a tokenizer, prepare a dataset, look inside one.

Example::

    baton data tokenizer --vocab-size 4096 --output runs/tok          # CPython's reference text
    baton data tokenizer --input a.txt b.txt --vocab-size 8192 --output runs/tok
    baton data prepare web.jsonl notes.txt --tokenizer runs/tok --output data/corpus
    baton data prepare shards/*.parquet --text-key content --tokenizer runs/tok \\
        --output data/web --workers 8
    baton data prepare chat.jsonl --tokenizer runs/tok --seq-len 2048 --output data/chat
    baton data prepare prompts.jsonl --tokenizer runs/tok --output data/prompts   # GRPO's
    baton data inspect data/corpus -n 3

Bad input (a missing file or key, text that is not UTF-8, an empty corpus, an existing
output, a tokenizer whose ids do not fit) prints one line naming the problem and the fix
and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from baton.data import DataError


def _fail(command: str, message: str) -> int:
    print(f"baton data {command}: {message}", file=sys.stderr)
    return 2


def cmd_tokenizer(argv: Sequence[str]) -> int:
    from baton.data import train_tokenizer
    from baton.tools.data.sources import TXT_SPLITS, open_sources

    parser = argparse.ArgumentParser(
        prog="baton data tokenizer",
        description="Train a byte-level BPE offline; save a Hugging Face tokenizer directory.",
    )
    parser.add_argument(
        "--input",
        nargs="+",
        type=Path,
        help=".txt, .jsonl, .parquet files or saved dataset dirs, read as `baton data prepare` "
        "reads them (default: CPython's language reference)",
    )
    parser.add_argument("--text-key", default="text", help="JSON key / column of the text")
    parser.add_argument(
        "--txt-split", choices=TXT_SPLITS, default="file", help="documents of a .txt file"
    )
    parser.add_argument("--vocab-size", type=int, required=True, help="tokens, specials included")
    parser.add_argument("--output", type=Path, required=True, help="the directory to write")
    parser.add_argument("--force", action="store_true", help="replace an existing tokenizer")
    args = parser.parse_args(argv)
    if (args.output / "tokenizer.json").exists() and not args.force:
        return _fail(
            "tokenizer",
            f"{args.output / 'tokenizer.json'} already exists; pass --force to replace it",
        )
    try:
        texts = None
        if args.input:  # the documents' texts, never the raw JSON or Parquet bytes
            sources = open_sources(args.input, args.text_key, args.txt_split)
            texts = (text for source in sources for text in source.documents())
        info = train_tokenizer(args.output, vocab_size=args.vocab_size, texts=texts)
    except DataError as error:
        return _fail("tokenizer", str(error))
    print(
        f"wrote {info.path}: {info.vocab_size:,} tokens, end of document {info.eod_token!r} = "
        f"{info.eod_id}, fingerprint {info.short_fingerprint}"
    )
    return 0


def _prepare_parser() -> argparse.ArgumentParser:
    from baton.tools.data.prepare import DTYPES
    from baton.tools.data.sources import TXT_SPLITS

    parser = argparse.ArgumentParser(
        prog="baton data prepare",
        description="Tokenize local text into Megatron's indexed dataset (PREFIX.bin/.idx/.json); "
        "with --seq-len, conversations or preference pairs packed into rows with a loss mask "
        '(PREFIX.mask.bin); prompt-only records ({"prompt": ...}, for GRPO) into one '
        "sequence per prompt and their records (PREFIX.prompts.jsonl).",
    )
    parser.add_argument("inputs", nargs="+", help=".txt, .jsonl, .parquet or saved dataset dirs")
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer directory")
    parser.add_argument("--output", required=True, help="the output prefix (PREFIX.bin, ...)")
    parser.add_argument("--text-key", default="text", help="JSON key / column of the text")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="tokenizer processes"
    )
    parser.add_argument(
        "--txt-split", choices=TXT_SPLITS, default="file", help="documents of a .txt file"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="token dtype in .bin")
    parser.add_argument("--force", action="store_true", help="replace an existing output")
    _add_posttrain_options(parser)
    return parser


def _add_posttrain_options(parser: argparse.ArgumentParser) -> None:
    post = parser.add_argument_group(
        "post-training (conversations and preference pairs, packed into rows)"
    )
    post.add_argument(
        "--seq-len",
        type=int,
        help="tokens per row (a row holds seq_len + 1 tokens); required for conversations "
        "and pairs, whose output is packed rows with a loss mask",
    )
    post.add_argument(
        "--format",
        choices=("messages", "prompt_completion", "preference", "prompt"),
        help="the records' format (default: recognised from their fields; prompt: each "
        "record's prompt alone, for GRPO, without --seq-len)",
    )
    post.add_argument(
        "--chat-template", help="a Jinja chat template file, for a tokenizer without one"
    )
    post.add_argument(
        "--mask",
        choices=("assistant", "all", "last_assistant"),
        default="assistant",
        help="the supervised tokens of a conversation (prompt/completion and pairs: the "
        "completion)",
    )
    post.add_argument(
        "--truncate",
        action="store_true",
        help="cut documents longer than a row (default: refuse them)",
    )


def cmd_prepare(argv: Sequence[str]) -> int:
    from baton.tools.data.prepare import prepare

    args = _prepare_parser().parse_args(argv)
    if args.workers < 1:
        return _fail("prepare", f"--workers must be at least 1, not {args.workers}")
    try:
        if args.format == "prompt" or (
            args.seq_len is None and args.format is None and _holds_prompts(args)
        ):
            return _prepare_prompts(args)
    except DataError as error:
        return _fail("prepare", str(error))
    if args.seq_len is not None or args.format is not None:
        return _prepare_posttrain(args)
    started = time.perf_counter()
    try:
        _refuse_conversations(args.inputs, args.text_key)
        manifest = prepare(
            args.inputs,
            args.tokenizer,
            args.output,
            text_key=args.text_key,
            workers=args.workers,
            txt_split=args.txt_split,
            dtype=args.dtype,
            force=args.force,
            progress=sys.stderr.isatty(),
        )
    except DataError as error:
        return _fail("prepare", str(error))
    except KeyboardInterrupt:
        return _fail("prepare", "interrupted; nothing was written")
    seconds = time.perf_counter() - started
    print(
        f"wrote {args.output}.bin/.idx/.json: {manifest.documents:,} documents, "
        f"{manifest.tokens:,} {manifest.dtype} tokens in {seconds:.1f} s "
        f"({manifest.tokens / max(seconds, 1e-9):,.0f} tokens/s)"
    )
    return 0


def _refuse_conversations(inputs: Sequence[str], text_key: str) -> None:
    """Raise :class:`DataError` if the first input holds conversations or pairs (they need
    ``--seq-len``) rather than text."""
    from baton.tools.data.formats import FIELDS
    from baton.tools.data.sources import open_sources

    source = open_sources(inputs[:1], text_key)[0]
    if source.kind != "jsonl":  # Parquet and datasets: their text-column check says it
        return
    for where, record in source.records():
        if text_key not in record and any(
            all(key in record for key in keys) for keys in FIELDS.values()
        ):
            raise DataError(
                f"{where} is a conversation or preference pair, not text: prepare it with "
                "--seq-len N (the packed row length), or pass --text-key for text"
            )
        return


def _holds_prompts(args: argparse.Namespace) -> bool:
    """Whether the first input's first record is a prompt alone (``{"prompt": ...}``)."""
    from baton.tools.data.formats import record_format
    from baton.tools.data.sources import open_sources

    source = open_sources(args.inputs[:1], args.text_key)[0]
    if source.kind == "txt":
        return False
    for where, record in source.records():
        if args.text_key in record:
            return False
        try:
            return record_format(record, where) == "prompt"
        except DataError:
            return False
    return False


def _prepare_prompts(args: argparse.Namespace) -> int:
    from baton.tools.data.prompts import prepare_prompts

    if args.seq_len is not None:
        return _fail("prepare", "prompts (for GRPO) are not packed into rows: leave out --seq-len")
    started = time.perf_counter()
    try:
        manifest = prepare_prompts(
            args.inputs,
            args.tokenizer,
            args.output,
            chat_template=args.chat_template,
            input_format=args.format,
            force=args.force,
        )
    except KeyboardInterrupt:
        return _fail("prepare", "interrupted; nothing was written")
    seconds = time.perf_counter() - started
    kind = "turns" if manifest["conversational"] else "text"
    columns = ", ".join(manifest["columns"]) or "none"
    print(
        f"wrote {args.output}.bin/.idx/.prompts.jsonl/.json (prompts, {kind}): "
        f"{manifest['prompts']:,} prompts, {manifest['tokens']:,} tokens, the longest "
        f"{manifest['max_prompt_length']:,} tokens, columns: {columns}, in {seconds:.1f} s"
    )
    return 0


def _prepare_posttrain(args: argparse.Namespace) -> int:
    from baton.tools.data.posttrain import prepare_posttrain

    if args.seq_len is None:
        return _fail("prepare", "conversations and pairs are packed into rows: pass --seq-len N")
    started = time.perf_counter()
    try:
        manifest = prepare_posttrain(
            args.inputs,
            args.tokenizer,
            args.output,
            seq_len=args.seq_len,
            input_format=args.format,
            chat_template=args.chat_template,
            mask=args.mask,
            truncate=args.truncate,
            force=args.force,
        )
    except DataError as error:
        return _fail("prepare", str(error))
    except KeyboardInterrupt:
        return _fail("prepare", "interrupted; nothing was written")
    seconds = time.perf_counter() - started
    packing = manifest["packing"]
    cut = f", {manifest['truncated']:,} cut to a row" if manifest["truncated"] else ""
    print(
        f"wrote {args.output}.bin/.idx/.mask.bin/.json ({manifest['objective']}, "
        f"{manifest['input_format']}): {manifest['records']:,} records, "
        f"{manifest['documents']:,} documents, {manifest['tokens']:,} tokens "
        f"({manifest['supervised_tokens']:,} supervised) in {packing['rows']:,} rows of "
        f"{args.seq_len + 1}, fill {packing['fill']:.1%}{cut}, in {seconds:.1f} s"
    )
    return 0


def cmd_inspect(argv: Sequence[str]) -> int:
    from baton.tools.data.describe import describe

    parser = argparse.ArgumentParser(
        prog="baton data inspect",
        description="Print what a prepared dataset holds (documents and tokens; rows, "
        "conversations or pairs and supervised tokens; prompts and their columns) and its first "
        "items, decoded, the supervised tokens in [[...]].",
    )
    parser.add_argument("prefix", help="the dataset prefix (PREFIX.bin, PREFIX.idx)")
    parser.add_argument("--tokenizer", help="decode with this tokenizer (default: the manifest's)")
    parser.add_argument(
        "-n", type=int, default=3, help="documents, conversations, pairs or prompts to show"
    )
    parser.add_argument("--chars", type=int, default=400, help="characters shown per item")
    args = parser.parse_args(argv)
    try:
        report = describe(
            args.prefix, args.tokenizer, count=args.n, chars=args.chars, color=sys.stdout.isatty()
        )
        print(report)
    except DataError as error:
        return _fail("inspect", str(error))
    return 0


SUBCOMMANDS = {"tokenizer": cmd_tokenizer, "prepare": cmd_prepare, "inspect": cmd_inspect}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    command = SUBCOMMANDS.get(args[0])
    if command is None:
        return _fail(args[0], f"unknown command; commands: {', '.join(SUBCOMMANDS)}")
    return command(args[1:])


if __name__ == "__main__":
    sys.exit(main())
