"""One TensorBoard event file, written directly with a C ``crc32c`` (no thread, no torch).

Example::

    from tensorboard.compat.proto import event_pb2

    events = EventFile("runs/x/logs/tensorboard")   # events.out.tfevents.<time>.<host>.<pid>.<n>
    events.add_event(event_pb2.Event(wall_time=time.time(), step=10, summary=...))
    events.close()

An event file is a TFRecord file of serialized ``Event`` protos, the first one naming the
format (``file_version="brain.Event:2"``). Each record is, little-endian::

    uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

TensorBoard's reader checks both checksums. ``tensorboard``'s own writer computes them in
pure Python (~50 us per kilobyte); the ``crc32c`` package computes them in C (SSE4.2 or
ARMv8 CRC instructions where the CPU has them) in well under a microsecond.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from pathlib import Path
from typing import IO, Any

from crc32c import crc32c  # pyright: ignore[reportMissingTypeStubs]

_MASK_DELTA = 0xA282EAD8
_file_numbers = itertools.count()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: the CRC-32C of ``data``, rotated right by 15 bits plus a constant
    (a CRC of data that holds CRCs is then not trivially related to them)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """``data`` as one TFRecord record: its length, the length's checksum, data, its checksum."""
    header = struct.pack("<Q", len(data))
    return b"".join(
        (
            header,
            struct.pack("<I", masked_crc32c(header)),
            data,
            struct.pack("<I", masked_crc32c(data)),
        )
    )


class EventFile:
    """A new event file in ``log_dir``; events are written where they are added and reach
    the file at once (``flush_secs=0``) or at most ``flush_secs`` seconds later."""

    def __init__(self, log_dir: str | Path, flush_secs: float = 0.0) -> None:
        from tensorboard.compat.proto import event_pb2  # pyright: ignore[reportMissingTypeStubs]

        self.path = Path(log_dir) / (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
            f".{os.getpid()}.{next(_file_numbers)}"
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_secs = flush_secs
        self._file: IO[bytes] | None = open(self.path, "wb")
        self._flushed_at = time.monotonic()
        protos: Any = event_pb2
        self.add_event(
            protos.Event(
                wall_time=time.time(),
                file_version="brain.Event:2",
                source_metadata=protos.SourceMetadata(writer="baton"),
            )
        )
        self.flush()

    def add_event(self, event: Any) -> None:
        """Append one ``Event`` proto."""
        self.write(event.SerializeToString())

    def write(self, data: bytes) -> None:
        """Append one record holding ``data`` (a serialized ``Event``)."""
        if self._file is None:
            raise ValueError(f"event file {self.path} is closed")
        self._file.write(frame(data))
        if time.monotonic() - self._flushed_at >= self.flush_secs:
            self.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._flushed_at = time.monotonic()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
