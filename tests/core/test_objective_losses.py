"""The objectives' losses, written once against the array API: the same numbers on numpy,
torch and JAX arrays, and GRPO's the numbers of TRL's own ``GRPOTrainer._compute_loss``
for every loss type, importance-sampling level and KL weight."""

from __future__ import annotations

import math
import types
from typing import Any

import numpy as np
import pytest
import torch
from array_api_compat import array_namespace

from baton.core.objectives import LossInputs, ObjectiveRun, Rows

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def packed(seed: int = 0) -> dict[str, np.ndarray]:
    """Three rows of documents, their masks, values and log-probabilities (numpy)."""
    rng = np.random.default_rng(seed)
    segments = np.array(
        [[1] * 3 + [2] * 3 + [3] * 3 + [4] * 3, [1] * 6 + [2] * 6, [1] * 4 + [2] * 4 + [0] * 4],
        dtype=np.int32,
    )
    documents = np.array([[0, 1, 2, 3], [4, 5, -1, -1], [6, 7, -1, -1]])
    mask = (rng.random(segments.shape) > 0.3) & (segments > 0)
    logps = -rng.random(segments.shape).astype(np.float32) * 3
    return {
        "segments": segments,
        "documents": documents,
        "mask": mask,
        "logps": np.where(segments > 0, logps, 0).astype(np.float32),
        "entropy": rng.random(segments.shape).astype(np.float32),
        "reference_logps": (-rng.random(documents.shape) * 20).astype(np.float32),
        "old_logps": (logps + rng.normal(0, 0.3, logps.shape)).astype(np.float32),
        "ref_logps": (logps + rng.normal(0, 0.2, logps.shape)).astype(np.float32),
        "advantages": rng.normal(0, 1, documents.shape).astype(np.float32),
    }


def inputs(arrays: dict[str, Any], convert: Any) -> LossInputs:
    values = {
        k: convert(arrays[k]) for k in ("reference_logps", "old_logps", "ref_logps", "advantages")
    }
    rows = Rows(
        convert(arrays["mask"]), convert(arrays["segments"]), convert(arrays["documents"]), values
    )
    return LossInputs(rows, convert(arrays["logps"]), convert(arrays["entropy"]))


def evaluate(run: ObjectiveRun, arrays: dict[str, Any], convert: Any) -> dict[str, float]:
    given = inputs(arrays, convert)
    xp = array_namespace(given.logps)
    terms = run.loss(xp, given)
    out = {"total": float(terms.total), "items": float(run.items(xp, given.rows))}
    for name, (total, weight) in terms.metrics.items():
        out[name] = float(total) / max(float(weight), 1.0)
    return out


RUNS = [
    ObjectiveRun.of("sft"),
    ObjectiveRun.of("dpo"),
    ObjectiveRun.of("dpo", dpo_loss="ipo", dpo_beta=0.5),
    *(
        ObjectiveRun.of(
            "grpo", reward=("r",), loss_type=kind, importance_sampling_level=level, beta=beta
        )
        for kind in ("dapo", "grpo", "bnpo", "dr_grpo")
        for level in ("token", "sequence")
        for beta in (0.0, 0.04)
    ),
]


@pytest.mark.parametrize("run", RUNS, ids=lambda r: "-".join(str(v) for v in r.settings().values()))
def test_numpy_torch_and_jax_compute_the_same_loss(run):
    import jax.numpy as jnp

    arrays = packed()
    reference = evaluate(run, arrays, np.asarray)
    for convert in (torch.from_numpy, jnp.asarray):
        got = evaluate(run, arrays, convert)
        assert got.keys() == reference.keys()
        for name, value in reference.items():
            assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_a_grpo_step_at_ratio_one_is_minus_the_mean_advantage():
    arrays = packed()
    arrays["old_logps"] = arrays["logps"]
    run = ObjectiveRun.of("grpo", reward=("r",))
    got = evaluate(run, arrays, torch.from_numpy)
    tokens = arrays["segments"] * arrays["mask"]
    per_token = np.take_along_axis(
        np.concatenate([np.zeros((3, 1)), arrays["advantages"]], axis=1), tokens, axis=1
    )
    assert got["total"] == pytest.approx(-float((per_token * arrays["mask"]).sum()), rel=1e-6)
    assert got["items"] == arrays["mask"].sum()
    assert got["clip_ratio/region_mean"] == 0.0


class Accelerator:
    """One process: what TRL's loss asks of its accelerator."""

    num_processes = 1

    def gather(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def reduce(self, value: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return value


def trl_loss(arrays: dict[str, np.ndarray], run: ObjectiveRun, max_len: int) -> dict[str, float]:
    """TRL's ``GRPOTrainer._compute_loss`` on the same completions, one per row as TRL
    pads them: the documents of the packed rows become TRL's batch of completions."""
    from collections import defaultdict

    from trl import GRPOTrainer

    completions, masks, logps, old, ref, entropy, advantages = [], [], [], [], [], [], []
    for b in range(arrays["segments"].shape[0]):
        for d, index in enumerate(arrays["documents"][b]):
            if index < 0:
                continue
            where = arrays["segments"][b] == d + 1
            n = int(where.sum())
            pad = max_len - n

            def row(key: str, b: int = b, where: np.ndarray = where, pad: int = pad) -> np.ndarray:
                return np.concatenate([arrays[key][b][where], np.zeros(pad, dtype=np.float32)])

            completions.append(index)
            masks.append(np.concatenate([arrays["mask"][b][where], np.zeros(pad, dtype=bool)]))
            logps.append(row("logps"))
            old.append(row("old_logps"))
            ref.append(row("ref_logps"))
            entropy.append(row("entropy"))
            advantages.append(arrays["advantages"][b, d])
    per_token = torch.tensor(np.stack(logps))
    settings = run.values
    trainer: Any = types.SimpleNamespace(
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=settings["importance_sampling_level"],
        beta=settings["beta"],
        loss_type=settings["loss_type"],
        epsilon_low=settings["epsilon"],
        epsilon_high=settings["epsilon"],
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=True, steps_per_generation=1),
        use_vllm=False,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=Accelerator(),
        _metrics={"train": defaultdict(list)},
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        max_completion_length=max_len,
        _get_per_token_logps_and_entropies=lambda *a, **k: (
            per_token,
            torch.tensor(np.stack(entropy)),
            None,
        ),
    )
    n = len(completions)
    batch = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, max_len, dtype=torch.long),
        "completion_mask": torch.tensor(np.stack(masks)).long(),
        "advantages": torch.tensor(np.array(advantages)),
        "old_per_token_logps": torch.tensor(np.stack(old)),
        "ref_per_token_logps": torch.tensor(np.stack(ref)),
        "num_items_in_batch": torch.tensor(float(np.stack(masks).sum())),
    }
    loss = GRPOTrainer._compute_loss(trainer, None, batch)
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return {"loss": float(loss), **metrics}


@pytest.mark.parametrize(
    "run",
    [r for r in RUNS if r.name == "grpo"],
    ids=lambda r: "-".join(str(r[k]) for k in ("loss_type", "importance_sampling_level", "beta")),
)
def test_grpo_is_trls_loss(run):
    arrays = packed(seed=3)
    max_len = 6
    trl = trl_loss(arrays, ObjectiveRun.of(run, max_completion_length=max_len), max_len)
    ours = evaluate(ObjectiveRun.of(run, max_completion_length=max_len), arrays, torch.from_numpy)
    assert ours["total"] / ours["items"] == pytest.approx(trl["loss"], rel=1e-5)
    for name in (
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "entropy",
    ):
        assert ours[name] == pytest.approx(trl[name], rel=1e-5, abs=1e-7), name
    if run["beta"]:
        assert ours["kl"] == pytest.approx(trl["kl"], rel=1e-5)


def pair_rows(
    pi_c: list[float], pi_r: list[float], n_c: list[int], n_r: list[int]
) -> tuple[np.ndarray, Rows]:
    """One row per pair (chosen document 1, rejected 2), each target's log-probability
    its document's total divided over its tokens: the documents' sums are ``pi_*``."""
    width = max(n_c) + max(n_r)
    logps = np.zeros((len(pi_c), width), dtype=np.float32)
    segments = np.zeros((len(pi_c), width), dtype=np.int32)
    for b, (c, r, m, k) in enumerate(zip(pi_c, pi_r, n_c, n_r, strict=True)):
        logps[b, :m], segments[b, :m] = c / m, 1
        logps[b, m : m + k], segments[b, m : m + k] = r / k, 2
    documents = np.array([[2 * b, 2 * b + 1] for b in range(len(pi_c))])
    return logps, Rows(segments > 0, segments, documents)


def test_dpo_is_trls_sigmoid_and_ipo_losses_on_hand_made_pairs():
    pi_c, pi_r, ref_c, ref_r = [-10.0, -20.0], [-12.0, -18.0], [-11.0, -19.0], [-11.0, -19.0]
    logps, rows = pair_rows(pi_c, pi_r, [2, 4], [1, 2])
    reference = np.array([[c, r] for c, r in zip(ref_c, ref_r, strict=True)], dtype=np.float32)
    given = LossInputs(
        Rows(*(torch.from_numpy(np.asarray(a)) for a in (rows.mask, rows.segments, rows.documents)),
             {"reference_logps": torch.from_numpy(reference)}),
        torch.from_numpy(logps),
    )  # fmt: skip
    xp = array_namespace(given.logps)
    sigmoid = ObjectiveRun.of("dpo", dpo_beta=0.5).loss(xp, given)
    # c - r = (pi_c - ref_c) - (pi_r - ref_r): 2 and -2
    expected = -torch.nn.functional.logsigmoid(0.5 * torch.tensor([2.0, -2.0])).sum()
    assert float(sigmoid.total) == pytest.approx(float(expected), rel=1e-6)
    ipo = ObjectiveRun.of("dpo", dpo_beta=0.5, dpo_loss="ipo").loss(xp, given)
    delta = torch.tensor([1.0 / 2 - (-1.0) / 1, -1.0 / 4 - 1.0 / 2])  # per-token log-ratios
    assert float(ipo.total) == pytest.approx(float(((delta - 1.0) ** 2).sum()), rel=1e-6)
    total, pairs = sigmoid.metrics["rewards/margins"]
    assert float(pairs) == 2 and float(total) == pytest.approx(0.5 * (2 - 2), abs=1e-6)
    assert float(sigmoid.metrics["rewards/accuracies"][0]) == 1.0
    assert float(sigmoid.metrics["logps/chosen"][0]) == pytest.approx(-30.0)


def test_dpo_at_the_reference_is_log_two_per_pair():
    logps, rows = pair_rows([-10.0, -20.0], [-12.0, -18.0], [2, 4], [1, 2])
    reference = np.array([[-10.0, -12.0], [-20.0, -18.0]], dtype=np.float32)
    rows = Rows(rows.mask, rows.segments, rows.documents, {"reference_logps": reference})
    terms = ObjectiveRun.of("dpo").loss(array_namespace(logps), LossInputs(rows, logps))
    assert float(terms.total) == pytest.approx(2 * math.log(2), rel=1e-6)
