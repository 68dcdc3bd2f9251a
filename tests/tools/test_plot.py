"""`baton plot` with several run directories: every run's curves on one chart."""

from __future__ import annotations

from pathlib import Path

from baton.callbacks.sinks.jsonl import JsonlSink
from baton.tools.plot import comparison_chart, main, run_labels, series

PNG = b"\x89PNG\r\n\x1a\n"


def log_run(run_dir: Path, rows: list[dict[str, float]]) -> Path:
    sink = JsonlSink(run_dir / "logs" / "metrics.jsonl")
    sink.open(None)
    for step, metrics in enumerate(rows, start=1):
        sink.write(step * 10, metrics)
    sink.close()
    return run_dir


def test_several_runs_share_one_chart_per_metric(tmp_path: Path, capsys) -> None:
    fabric = log_run(
        tmp_path / "runs" / "fabric",
        [{"loss": 3.0 - i * 0.5, "throughput/tokens_per_s": 1000.0 + i} for i in range(4)],
    )
    megatron = log_run(
        tmp_path / "runs" / "megatron",
        [{"loss": 3.1 - i * 0.4} for i in range(3)] + [{"loss": 1.9, "eval/loss": 2.0}],
    )
    assert main([str(fabric), str(megatron)]) == 0
    written = capsys.readouterr().out.split()
    out = tmp_path / "runs" / "comparison"
    assert written == [str(out / "loss.png"), str(out / "throughput.png")]  # nobody logged lr
    for path in written:
        assert Path(path).read_bytes()[:8] == PNG

    loss = series([fabric, megatron], ("loss", "eval/loss"))
    assert loss["fabric"] == {"loss": ([10.0, 20.0, 30.0, 40.0], [3.0, 2.5, 2.0, 1.5])}
    assert loss["megatron"]["eval/loss"] == ([40.0], [2.0])
    assert list(series([fabric, megatron], ("throughput/tokens_per_s",))) == ["fabric"]

    assert main([str(fabric), str(megatron), "--out", str(tmp_path / "charts")]) == 0
    assert (tmp_path / "charts" / "loss.png").read_bytes()[:8] == PNG


def test_runs_with_the_same_name_are_told_apart_and_a_missing_log_is_named(tmp_path, capsys):
    a, b = tmp_path / "one" / "run", tmp_path / "two" / "run"
    assert run_labels([a, b]) == [str(a), str(b)]
    log_run(a, [{"loss": 1.0}])
    assert main([str(a), str(b)]) == 2
    assert f"{b / 'logs' / 'metrics.jsonl'} not found" in capsys.readouterr().err


def test_a_single_evaluation_point_is_drawn_as_a_marker(tmp_path: Path) -> None:
    a = log_run(tmp_path / "a", [{"loss": 3.0}, {"loss": 2.0, "eval/loss": 2.2}])
    b = log_run(tmp_path / "b", [{"loss": 3.1}, {"loss": 2.1}])
    fig = comparison_chart("loss", [a, b])
    assert fig is not None
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["a", "a (eval/loss)", "b"]
    for line in lines:  # a line through one point draws nothing: it needs a marker
        assert len(line.get_xdata()) > 1 or line.get_marker() not in ("None", "", None)
