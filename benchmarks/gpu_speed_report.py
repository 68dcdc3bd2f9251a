"""What ``gpu_speed.py`` reports: each row's printed line, the targets judged on the
rows' results, the run's environment (device, versions, sizes) and the two files under
``--out``, ``gpu_speed.json`` and ``gpu_speed.md``.

Example::

    results = {"fabric-sft-1x4": Result("fabric-sft-1x4", "baton Fabric SFT, 1 x 4",
                                        seconds_per_step=0.24, mfu=0.36)}
    line(results["fabric-sft-1x4"])   # 'fabric-sft-1x4    0.24 s/step  MFU 36.0%  ...'
    for text, figures, passed in target_lines(results):
        print(f"target {text}: {figures}: {VERDICT[passed]}")
    write_results(Path("out"), list(results.values()), target_lines(results),
                  environment(TINY, "bf16-mixed", cuda=False, peak=None))
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu_speed_inputs import Shape
from benchmarks.gpu_speed_measure import Result

#: relative differences in bf16 the parity rows accept, levers against the plain path
PARITY_TOLERANCE = {"loss": 1e-2, "grad_norm": 5e-2}
VERDICT = {True: "yes", False: "NO", None: "n/a"}


# -- the targets ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """A target of the run: ``check(results)`` gives (the figures, passed) or None where
    its rows did not run (or MFU is unknown)."""

    text: str
    check: Callable[[dict[str, Result]], tuple[str, bool] | None]


def _mfu_at_least(floor: float) -> Callable[[dict[str, Result]], tuple[str, bool] | None]:
    def check(results: dict[str, Result]) -> tuple[str, bool] | None:
        got = {n: results[n].mfu for n in ("fabric-sft-1x4", "fabric-sft-4x1") if n in results}
        known = {n: m for n, m in got.items() if m is not None}
        if not known:
            return None
        text = ", ".join(f"{n} {m:.1%}" for n, m in known.items())
        return text, all(m >= floor for m in known.values())

    return check


def _ratio_at_most(
    rows: tuple[str, ...], baseline: str, ceiling: float
) -> Callable[[dict[str, Result]], tuple[str, bool] | None]:
    def check(results: dict[str, Result]) -> tuple[str, bool] | None:
        known = {n: results[n].ratios[baseline] for n in rows
                 if n in results and baseline in results[n].ratios}  # fmt: skip
        if not known:
            return None
        text = ", ".join(f"{n} {r:.3f}x" for n, r in known.items())
        return text, all(r <= ceiling for r in known.values())

    return check


def _same_mfu(results: dict[str, Result]) -> tuple[str, bool] | None:
    one, four = results.get("fabric-sft-1x4"), results.get("fabric-sft-4x1")
    if one is None or four is None or one.mfu is None or four.mfu is None:
        return None
    gap = abs(one.mfu - four.mfu) / max(one.mfu, four.mfu)
    return f"1x4 {one.mfu:.1%}, 4x1 {four.mfu:.1%}: {gap:.1%} apart", gap <= 0.05


def _parity(results: dict[str, Result]) -> tuple[str, bool] | None:
    known = {n: r.parity for n, r in results.items() if r.parity is not None}
    if not known:
        return None
    text = "; ".join(
        f"{n} " + ", ".join(f"{k} {v:.1e}" for k, v in parity.items())
        for n, parity in known.items()
    )
    met = all(v <= PARITY_TOLERANCE[k] for p in known.values() for k, v in p.items())
    return text, met


SFT = ("fabric-sft-1x4", "fabric-sft-4x1")
TARGETS: tuple[Target, ...] = (
    Target("Fabric SFT >= 35% MFU", _mfu_at_least(0.35)),
    Target("Fabric SFT <= 0.5x TRL SFTTrainer defaults", _ratio_at_most(SFT, "trl-sft-defaults", 0.5)),
    Target("Fabric SFT <= 0.8x TRL SFTTrainer matched", _ratio_at_most(SFT, "trl-sft-matched", 0.8)),
    Target("Fabric DPO <= 0.5x TRL DPOTrainer defaults",
           _ratio_at_most(("fabric-dpo",), "trl-dpo-defaults", 0.5)),
    Target("SFT MFU within 5% between 1x4 and 4x1", _same_mfu),
    Target("levers give the plain path's first loss (1e-2) and gradient norm (5e-2) in bf16",
           _parity),
)  # fmt: skip


def target_lines(results: dict[str, Result]) -> list[tuple[str, str, bool | None]]:
    """Each target's (text, figures, passed), passed None where it could not be judged."""
    out = []
    for target in TARGETS:
        checked = target.check(results)
        if checked is None:
            out.append((target.text, "n/a (rows not run, or MFU unknown)", None))
        else:
            out.append((target.text, *checked))
    return out


# -- lines, the environment, the files ------------------------------------------------------
def line(result: Result) -> str:
    """The row's one printed line."""
    if result.error is not None:
        return f"{result.name:<17} error: {result.error}"
    if result.skipped is not None:
        return f"{result.name:<17} skipped: {result.skipped}"
    if result.parity is not None:
        differences = ", ".join(f"{k} rel {v:.2e}" for k, v in result.parity.items())
        return f"{result.name:<17} {differences} ({result.note})  plain path: {result.paths}"
    parts = [f"{result.name:<17} {result.seconds_per_step:.4g} s/step"]
    parts += [f"{ratio:.3f}x {name}" for name, ratio in result.ratios.items()]
    parts.append("MFU n/a" if result.mfu is None else f"MFU {result.mfu:.1%}")
    memory = result.peak_memory_gib
    parts.append("peak n/a" if memory is None else f"peak {memory:.1f} GiB")
    parts.append(f"paths {result.paths}")
    return "  ".join(parts)


def environment(shape: Shape, precision: str, *, cuda: bool, peak: float | None) -> dict[str, Any]:
    """The date, the device and its peak, the packages' versions and the run's sizes."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    versions = {}
    for name in ("torch", "transformers", "trl", "lightning", "megatron-core", "accelerate",
                 "transformer-engine", "liger-kernel", "baton-backends"):  # fmt: skip
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    device = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "device": device,
        "peak_tflops": peak,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
        "shape": asdict(shape),
        "precision": precision,
    }


def markdown(results: list[Result], targets: list[tuple[str, str, bool | None]],
             env: dict[str, Any]) -> str:  # fmt: skip
    """The rows and the targets as two markdown tables under a line on the environment."""
    lines = [
        f"GPU speed, {env['date']} on {env['device']} (peak {env['peak_tflops'] or 'n/a'} TFLOP/s), "
        f"{env['precision']}; versions: "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        "",
        "| row | s/step | ratio | MFU | peak memory | paths |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.error is not None or r.skipped is not None:
            why = f"error: {r.error}" if r.error is not None else f"skipped: {r.skipped}"
            lines.append(f"| {r.title} | {why} | | | | |")
            continue
        if r.parity is not None:
            lines.append(f"| {r.title} | {r.note} | | | | {r.paths} |")
            continue
        ratio = ", ".join(f"{v:.3f}x {k}" for k, v in r.ratios.items())
        mfu = "n/a" if r.mfu is None else f"{r.mfu:.1%}"
        memory = "n/a" if r.peak_memory_gib is None else f"{r.peak_memory_gib:.1f} GiB"
        lines.append(
            f"| {r.title} | {r.seconds_per_step:.3f} | {ratio} | {mfu} | {memory} | {r.paths} |"
        )
    lines += ["", "| target | figures | met |", "|---|---|---|"]
    for text, figures, passed in targets:
        lines.append(f"| {text} | {figures} | {VERDICT[passed]} |")
    return "\n".join(lines) + "\n"


def write_results(out: Path, results: list[Result], targets: list[tuple[str, str, bool | None]],
                  env: dict[str, Any]) -> None:  # fmt: skip
    """``gpu_speed.json`` (the environment, the rows, the targets) and ``gpu_speed.md``
    under ``out`` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "environment": env,
        "rows": [asdict(r) for r in results],
        "targets": [{"target": t, "figures": f, "met": p} for t, f, p in targets],
    }
    (out / "gpu_speed.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out / "gpu_speed.md").write_text(markdown(results, targets, env))
