"""The shared harness: interleaving order, paired ratios, the table and the JSON file."""

import json

import pytest

from benchmarks.harness import Row, format_table, interleave, paired_ratio, skipped, write_json


def test_interleave_runs_cases_round_robin_and_drops_warmup() -> None:
    calls: list[str] = []

    def case(name: str, value: float):
        def run() -> float:
            calls.append(name)
            return value + len(calls)

        return run

    samples = interleave({"a": case("a", 0), "b": case("b", 100)}, rounds=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert samples == {"a": [3, 5, 7], "b": [104, 106, 108]}


def test_paired_ratio_is_the_median_of_per_round_ratios() -> None:
    # round 2 is spoiled for both sides alike: pairing cancels it, the median drops round 3
    assert paired_ratio([2.0, 20.0, 9.0], [1.0, 10.0, 1.0]) == 2.0
    with pytest.raises(ValueError, match="unpaired"):
        paired_ratio([1.0], [1.0, 2.0])


def test_table_and_json(tmp_path) -> None:
    rows = [
        Row("x", "base", 2.0, "ms/step"),
        Row(
            "x", "other", 2.1, "ms/step", ratio=1.05, baseline="base", target="<= 1.1", passed=True
        ),
        skipped("x", "missing", "not installed"),
    ]
    table = format_table(rows)
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows)
    assert "1.050 vs base" in lines[3] and "yes" in lines[3]
    assert "skipped: not installed" in lines[4]
    write_json(tmp_path / "r.json", rows, settings={"quick": True})
    data = json.loads((tmp_path / "r.json").read_text())
    assert [r["case"] for r in data["rows"]] == ["base", "other", "missing"]
    assert data["machine"]["cpus"] >= 1


def test_lockstep_takes_turns_one_block_at_a_time() -> None:
    """Each loop in a process of its own; the blocks' ends, on the clock the processes
    share, come in turns, rotating who goes first; what a loop returns comes back."""
    from benchmarks.harness import Lockstep
    from support.lockstep_loops import stamped

    times, results = Lockstep({"a": (stamped, (3,)), "b": (stamped, (2,))}).run()
    ends = sorted((stamp, name) for name, stamps in results.items() for stamp in stamps)
    assert [name for _, name in ends] == ["a", "b", "b", "a", "a"]  # one block each a round
    assert [len(times["a"]), len(times["b"])] == [3, 2]
    assert all(t >= 0 for t in times["a"] + times["b"])


def test_lockstep_reports_a_failing_loop() -> None:
    from benchmarks.harness import Lockstep
    from support.lockstep_loops import failing, stamped

    with pytest.raises(RuntimeError, match=r"loop 'bad' failed.*boom"):
        Lockstep({"ok": (stamped, (3,)), "bad": (failing, ())}).run()
