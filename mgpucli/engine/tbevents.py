"""TensorBoard scalars, written without importing TensorBoard.

mgpu logs a handful of scalars per log interval. The writers that ship with torch and tensorboard import
TensorBoard (and its TensorFlow stub) on rank 0, which then needs the package where it trains and pays for it in
memory and start-up. An event file of scalars is a small, frozen format, so it is written here directly:

* a TFRecord stream: each record is ``uint64 length``, ``uint32 masked_crc32c(length)``, the bytes,
  ``uint32 masked_crc32c(bytes)`` (little-endian);
* each record is one ``tensorboard.Event`` protobuf: the first carries ``file_version = "brain.Event:2"``,
  the others ``wall_time``, ``step`` and a ``Summary`` of ``Value{tag, simple_value}``.

tests/unit/test_tbevents.py reads these files back with TensorBoard's own reader and protobuf classes.

Events are queued and written in batches, as TensorBoard's own writers do: up to 10 events or 10 s, checked when
an event is added, and everything at ``flush``/``close``. metrics.jsonl, not this file, is the record flushed at
every interval; a hard kill loses at most the queued TensorBoard events.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord: the framing TensorBoard's reader checks, CRCs included."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


# ------------------------------------------------------------------------------------- protobuf, by hand
def _varint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # int64: a negative value is its two's complement, ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): strings and nested messages."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int = 0, *, file_version: str | None = None,
          scalars: Mapping[str, float] | None = None) -> bytes:
    """``Event{wall_time: 1 (double), step: 2 (int64), file_version: 3 | summary: 5}``; ``Summary{value: 1}``;
    ``Summary.Value{tag: 1 (string), simple_value: 2 (float)}``."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time)
    if step:
        out += _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        out += _field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _field(1, _field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _field(5, values)
    return out


class ScalarWriter:
    """An event file in ``log_dir`` (created on first use), as TensorBoard names them; one per writer. Events
    are queued and written in batches (see the module docstring); ``flush`` writes the queue now."""

    def __init__(self, log_dir: str | Path, max_queue: int = 10, flush_s: float = 10.0):
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.0"
        self.path = log_dir / name
        self.max_queue, self.flush_s = max_queue, flush_s
        self._queue: list[tuple[float, int, dict[str, float]]] = []
        self._fh = open(self.path, "ab")  # noqa: SIM115 - kept open for the run
        self._fh.write(record(event(now, file_version="brain.Event:2")))
        self._fh.flush()
        self._written_at = time.monotonic()

    def add_scalars(self, step: int, scalars: Mapping[str, float], wall_time: float | None = None) -> None:
        self._queue.append((time.time() if wall_time is None else wall_time, step, dict(scalars)))
        if len(self._queue) >= self.max_queue or time.monotonic() - self._written_at >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """Encode and write every queued event, in one write."""
        if self._queue:
            self._fh.write(b"".join(record(event(t, step, scalars=sc)) for t, step, sc in self._queue))
            self._queue.clear()
            self._fh.flush()
        self._written_at = time.monotonic()

    def close(self) -> None:
        if self._fh.closed:
            return
        try:
            self.flush()
        finally:
            self._fh.close()
