"""The same small Llama-style model on Fabric, TorchTitan, Megatron-Core and MaxText, on
identical tokens, with the four loss curves on one chart.

uv run baton compare                                  # zero setup, ~5 min on CPU
uv run baton compare --steps 100 --backends megatron maxtext
uv run baton compare --data-path data/corpus --tokenizer runs/tok

Without ``--data-path``/``--tokenizer`` it trains a byte-level BPE (``--vocab-size``
tokens) on the Python language reference and prepares that text once with it
(``baton data prepare``), under ``<run-dir>/data``; a second run reuses both. Each
backend then runs its own tiny recipe from ``--recipes`` (the project's ``recipes/``) in
its own process (``baton run``: a backend owns its process group or JAX runtime) on that dataset and tokenizer with the same steps,
batch, sequence length, learning rate and model shape, into ``<run-dir>/<backend>``
(its output in ``<run-dir>/<backend>.log``). The loss curves land in
``<run-dir>/comparison/loss.png`` (``baton plot`` with the four run directories) and a
table of first and final losses is printed.

Where the four differ (each recipe keeps its backend's own choices):

- Fabric (``quickstart.py``) trains baton's small GPT: LayerNorm, a GELU MLP of width
  ``4 x hidden``, learned positions, biases, tied embeddings. Not Llama-style.
- TorchTitan (``torchtitan_llama3_debug.py``) trains TorchTitan's ``llama3_debugmodel``
  unchanged: 6 layers, dim 256, 16 heads, SwiGLU width 768, vocabulary 2048. The default
  ``--layers/--hidden/--heads`` are that shape, so the Llama-style three agree; other
  shapes leave TorchTitan's as it is (said when the run starts).
- Megatron-Core (``megatron_gpt_tiny.py --llama``) and MaxText (``maxtext_tiny.py``,
  MaxText's ``llama2`` decoder block) build that shape: RMSNorm, SwiGLU of width
  ``8/3 x hidden`` rounded up to 256, rotary positions, no biases, untied output.
- Vocabulary: the tokenizer's size (2048 by default) for all; Megatron pads it to a
  multiple of 64, MaxText to 128 (equal at 2048).
- Initialisation, RoPE base, AdamW settings and the LR schedule (warmup, decay) are each
  backend's own; the peak learning rate ``--lr`` is shared.
- Each backend's own data pipeline cuts and orders the samples (Megatron's ``GPTDataset``,
  MaxText's Grain, TorchTitan's and Fabric's loaders): the same tokens, not the same
  batches in the same order.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from baton.callbacks.sinks.jsonl import FILE_NAME, read_jsonl

#: where the backends' tiny recipes are found unless ``--recipes`` says otherwise
RECIPES = Path("recipes")
BACKENDS = ("fabric", "torchtitan", "megatron", "maxtext")
#: TorchTitan's llama3 debug model, the one shape its recipe trains
TITAN_SHAPE = {"layers": 6, "hidden": 256, "heads": 16}
TITAN_VOCAB = 2048


def llama_ffn(hidden: int) -> int:
    """Llama's SwiGLU width: 8/3 of the model width rounded up to a multiple of 256."""
    return -(-8 * hidden // 3 // 256) * 256


def prepare_reference(data_dir: Path, vocab_size: int) -> tuple[str, str]:
    """A tokenizer and a prepared dataset of the Python language reference, made once."""
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    tokenizer, prefix = data_dir / "tokenizer", data_dir / "reference"
    if not (tokenizer / "tokenizer.json").is_file():
        train_tokenizer(tokenizer, vocab_size=vocab_size)
    if not Path(f"{prefix}.idx").is_file():
        source = data_dir / "reference.jsonl"
        with source.open("w", encoding="utf-8") as out:
            for document in reference_documents():
                out.write(json.dumps({"text": document}) + "\n")
        prepare([source], tokenizer, prefix, workers=1, force=True)
    return str(prefix), str(tokenizer)


def backend_command(
    backend: str,
    run_dir: Path,
    *,
    data_path: str,
    tokenizer: str,
    steps: int,
    layers: int,
    hidden: int,
    heads: int,
    seq_len: int,
    batch: int,
    lr: float,
    recipes: Path = RECIPES,
) -> list[str]:
    """``python -m baton.core.cli run <backend's tiny recipe> ...`` with the shared settings."""
    no_eval = f"--eval-every={steps + 1}"  # the recipes' held-out evaluation: past the end
    common = [
        f"--max-steps={steps}",
        f"--lr={lr}",
        f"--seq-len={seq_len}",
        f"--data-path={data_path}",
        f"--tokenizer={tokenizer}",
        f"--run-dir={run_dir / backend}",
        "--log-every=1",
        "--save-every=0",
        "--no-progress",
        "--overwrite",
    ]
    own = {
        "fabric": [
            "quickstart.py",
            f"--batch-size={batch}",
            f"--n-layer={layers}",
            f"--d-model={hidden}",
            f"--n-head={heads}",
            no_eval,
        ],
        "torchtitan": ["torchtitan_llama3_debug.py", f"--batch-size={batch}"],
        "megatron": [
            "megatron_gpt_tiny.py",
            "--llama",
            f"--micro-batch-size={batch}",
            f"--global-batch-size={batch}",
            f"--num-layers={layers}",
            f"--hidden-size={hidden}",
            f"--num-attention-heads={heads}",
            f"--min-lr={lr / 10}",
            no_eval,
            "--no-async-save",
        ],
        "maxtext": [
            "maxtext_tiny.py",
            f"--per-device-batch-size={batch}",
            f"--layers={layers}",
            f"--d-model={hidden}",
            f"--heads={heads}",
            "--eval-every=0",
            "--no-async-save",
            "--overrides",
            f"base_mlp_dim={llama_ffn(hidden)}",
        ],
    }[backend]
    recipe, flags = own[0], own[1:]
    return [sys.executable, "-m", "baton.core.cli", "run", str(recipes / recipe), *common, *flags]


def losses(run_dir: Path) -> list[float]:
    """The training losses a run logged, in step order."""
    return [r["loss"] for r in read_jsonl(run_dir / "logs" / FILE_NAME) if "loss" in r]


def compare(
    steps: int = 50,
    layers: int = 6,
    hidden: int = 256,
    heads: int = 16,
    seq_len: int = 128,
    batch: int = 4,
    lr: float = 1e-3,
    vocab_size: int = 2048,
    data_path: str | None = None,
    tokenizer: str | None = None,
    backends: tuple[str, ...] = BACKENDS,
    run_dir: str = "runs/compare_backends",
    recipes: str | Path = RECIPES,
) -> None:
    """Train one small Llama-style model on each backend on the same tokens; plot the losses.

    Args:
        steps: optimizer steps on each backend.
        layers: transformer layers (TorchTitan keeps its debug model's 6).
        hidden: model width (TorchTitan keeps 256).
        heads: attention heads (TorchTitan keeps 16).
        seq_len: tokens per sample.
        batch: samples per step.
        lr: peak learning rate.
        vocab_size: the BPE trained when no --tokenizer is given (at most 2048,
            TorchTitan's debug vocabulary).
        data_path: a prepared prefix (`baton data prepare`); with --tokenizer.
        tokenizer: the tokenizer directory the data was prepared with.
        backends: which backends to run, in order.
        run_dir: where the data, each backend's run and the chart go.
        recipes: the directory holding each backend's tiny recipe.
    """
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise ValueError(
            f"--backends {' '.join(backends) or '(none)'}: choose from {' '.join(BACKENDS)}"
        )
    if (data_path is None) != (tokenizer is None):
        raise ValueError(
            "pass both --data-path (a `baton data prepare` prefix) and --tokenizer (the "
            "directory it was prepared with), or neither to prepare the Python reference"
        )
    recipes = Path(recipes)
    if not (recipes / "quickstart.py").is_file():
        raise ValueError(
            f"--recipes {recipes} holds no baton recipes (quickstart.py, ...); run from the "
            "project's root or pass --recipes PATH/TO/recipes"
        )
    root = Path(run_dir)
    if data_path is None or tokenizer is None:
        if vocab_size > TITAN_VOCAB and "torchtitan" in backends:
            raise ValueError(
                f"--vocab-size {vocab_size} exceeds TorchTitan's debug vocabulary of "
                f"{TITAN_VOCAB}; use at most {TITAN_VOCAB}"
            )
        data_path, tokenizer = prepare_reference(root / "data", vocab_size)
        print(f"data: {data_path} (Python reference), tokenizer {tokenizer}", flush=True)
    shape = {"layers": layers, "hidden": hidden, "heads": heads}
    if "torchtitan" in backends and shape != TITAN_SHAPE:
        print(f"note: torchtitan keeps its debug model's shape {TITAN_SHAPE}", flush=True)

    wall: dict[str, float] = {}
    failed: list[str] = []
    for backend in backends:
        command = backend_command(
            backend,
            root,
            data_path=data_path,
            tokenizer=tokenizer,
            steps=steps,
            seq_len=seq_len,
            batch=batch,
            lr=lr,
            recipes=recipes,
            **shape,
        )
        log = root / f"{backend}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"{backend}: running (output in {log})", flush=True)
        start = time.perf_counter()
        with log.open("w", encoding="utf-8") as out:
            out.write(" ".join(command) + "\n")
            out.flush()
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
        wall[backend] = time.perf_counter() - start
        if code != 0:
            failed.append(f"{backend} (exit {code}, see {log})")
        print(f"{backend}: exit {code} after {wall[backend]:.0f} s", flush=True)

    finished = [b for b in backends if (root / b / "logs" / FILE_NAME).is_file()]
    if finished:
        from baton.tools.plot import plot_runs

        charts = plot_runs([root / b for b in finished], root / "comparison")
        print(f"\n{'backend':<12}{'steps':>6}{'first loss':>12}{'final loss':>12}{'wall s':>8}")
        for backend in finished:
            values = losses(root / backend)
            first, last = (values[0], values[-1]) if values else (math.nan, math.nan)
            print(f"{backend:<12}{len(values):>6}{first:>12.4f}{last:>12.4f}{wall[backend]:>8.0f}")
        print("charts: " + ", ".join(str(path) for path in charts))
    if failed:
        raise RuntimeError("backends failed: " + "; ".join(failed))


def main(argv: Sequence[str] | None = None) -> int:
    """``baton compare``: the arguments of ``compare`` as flags; 2 on bad input, 1 when a
    backend's run failed."""
    parser = argparse.ArgumentParser(prog="baton compare", description=compare.__doc__)
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps on each backend")
    parser.add_argument("--layers", type=int, default=6, help="transformer layers")
    parser.add_argument("--hidden", type=int, default=256, help="model width")
    parser.add_argument("--heads", type=int, default=16, help="attention heads")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sample")
    parser.add_argument("--batch", type=int, default=4, help="samples per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--vocab-size", type=int, default=2048, help="the BPE trained if needed")
    parser.add_argument("--data-path", default=None, help="a `baton data prepare` prefix")
    parser.add_argument("--tokenizer", default=None, help="the tokenizer it was prepared with")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), help="which, in order")
    parser.add_argument("--run-dir", default="runs/compare_backends", help="where results go")
    parser.add_argument("--recipes", default=str(RECIPES), help="the backends' tiny recipes")
    args = parser.parse_args(argv)
    try:
        compare(
            steps=args.steps,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            seq_len=args.seq_len,
            batch=args.batch,
            lr=args.lr,
            vocab_size=args.vocab_size,
            data_path=args.data_path,
            tokenizer=args.tokenizer,
            backends=tuple(args.backends),
            run_dir=args.run_dir,
            recipes=args.recipes,
        )
    except ValueError as error:
        print(f"baton compare: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"baton compare: {error}", file=sys.stderr)
        return 1
    return 0
