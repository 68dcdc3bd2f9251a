"""CompositeLogger writes on its own thread, in order, with nothing lost when fit returns or
raises; TensorBoard files written with the C checksum read back with TensorBoard's loader,
which rejects a corrupted record."""

from __future__ import annotations

import json
import struct
import threading
import time
from pathlib import Path

import pytest

from baton.callbacks import CompositeLogger
from baton.callbacks.sinks.jsonl import read_jsonl
from baton.core import Driver
from support.scalar_backend import ScalarBackend


class SlowThreadRecordingSink:
    """A sink that notes which thread writes and takes its time (as W&B over a slow network),
    so records are still queued when the loop ends."""

    name = "slow"

    def __init__(self, delay_s: float = 0.01) -> None:
        self.delay_s = delay_s
        self.threads: set[int] = set()
        self.steps: list[tuple[int, str]] = []

    def open(self, driver) -> None:
        pass

    def write(self, step, metrics, phase="train") -> None:
        time.sleep(self.delay_s)
        self.threads.add(threading.get_ident())
        self.steps.append((step, phase))

    def close(self) -> None:
        pass


def _driver(run_dir: Path, sink: SlowThreadRecordingSink, **kwargs) -> Driver:
    logger = CompositeLogger(["jsonl", "tensorboard", sink])
    return Driver(
        ScalarBackend(fail_at=kwargs.pop("fail_at", None)),
        [logger],
        max_steps=30,
        log_every=1,
        run_dir=run_dir,
        **kwargs,
    )


def _tensorboard_losses(run_dir: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "logs" / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars("loss")]


def test_sinks_write_off_the_training_thread_and_all_is_on_disk_after_fit(tmp_path) -> None:
    sink = SlowThreadRecordingSink()
    _driver(tmp_path, sink, eval_every=10).fit()
    assert threading.get_ident() not in sink.threads and len(sink.threads) == 1
    train = [(s, "train") for s in range(1, 31)]
    evals = [(s, "eval") for s in (10, 20, 30)]
    assert sink.steps == sorted(train + evals, key=lambda x: (x[0], x[1] == "eval"))
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [(r["step"], r["phase"]) for r in rows] == sink.steps  # same order, nothing lost
    assert _tensorboard_losses(tmp_path) == list(range(1, 31))


def test_a_crash_keeps_everything_logged_before_it(tmp_path) -> None:
    sink = SlowThreadRecordingSink()
    driver = _driver(tmp_path, sink, fail_at=21)
    with pytest.raises(RuntimeError, match="step 21 failed"):
        driver.fit()
    assert sink.steps == [(s, "train") for s in range(1, 21)]
    assert [int(r["step"]) for r in read_jsonl(tmp_path / "logs" / "metrics.jsonl")] == list(
        range(1, 21)
    )
    assert _tensorboard_losses(tmp_path) == list(range(1, 21))


def test_event_file_reads_back_and_a_corrupted_record_is_refused(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    from baton.callbacks.sinks.event_file import EventFile, masked_crc32c

    for data in (b"", b"a", bytes(range(256)) * 5):  # the C checksum is TensorFlow's
        assert masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)

    events = EventFile(tmp_path)
    for step in (1, 2, 3):
        value = summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / step)
        events.add_event(
            event_pb2.Event(wall_time=1.0, step=step, summary=summary_pb2.Summary(value=[value]))
        )
    events.close()

    def loaded() -> list[tuple[int, float]]:
        read = list(EventFileLoader(str(events.path)).Load())
        assert read[0].file_version == "brain.Event:2"
        return [(e.step, e.summary.value[0].tensor.float_val[0]) for e in read[1:]]

    assert loaded() == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]

    # flip one byte inside the second scalar event: the loader stops before it
    raw = bytearray(events.path.read_bytes())
    offset = 0
    for _ in range(2):  # skip the version record and the first event
        (length,) = struct.unpack_from("<Q", raw, offset)
        offset += 8 + 4 + length + 4
    raw[offset + 8 + 4 + 2] ^= 0xFF
    events.path.write_bytes(bytes(raw))
    assert loaded() == [(1, 1.0)]
