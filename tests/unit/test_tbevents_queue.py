"""The event file's queue: train intervals written in batches (10 events or 10 s), everything at flush/close,
validations at once (no TensorBoard needed: records are counted from their framing)."""

from __future__ import annotations

import struct

from mgpucli.engine import tbevents
from mgpucli.engine.rundir import MetricsWriter


def records(path) -> int:
    data, n, at = path.read_bytes(), 0, 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        at += 8 + 4 + length + 4
        n += 1
    assert at == len(data)  # whole records only
    return n


def test_events_wait_for_ten_then_go_in_one_write(tmp_path):
    writer = tbevents.ScalarWriter(tmp_path)
    assert records(writer.path) == 1  # the file_version record, at once
    for step in range(1, 10):
        writer.add_scalars(step, {"train/loss": 1.0 / step}, wall_time=1.0)
    assert records(writer.path) == 1  # 9 queued
    writer.add_scalars(10, {"train/loss": 0.1}, wall_time=1.0)
    assert records(writer.path) == 11
    writer.add_scalars(11, {"train/loss": 0.09}, wall_time=1.0)
    writer.close()  # the rest at close
    assert records(writer.path) == 12
    writer.close()  # twice is harmless


def test_an_old_queue_is_written_with_the_next_event(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(tbevents.time, "monotonic", lambda: clock[0])
    writer = tbevents.ScalarWriter(tmp_path, max_queue=10, flush_s=10.0)
    writer.add_scalars(1, {"train/loss": 1.0})
    clock[0] += 9.9
    writer.add_scalars(2, {"train/loss": 0.5})
    assert records(writer.path) == 1
    clock[0] += 0.2  # 10.1 s since the last write
    writer.add_scalars(3, {"train/loss": 0.25})
    assert records(writer.path) == 4
    writer.close()


def test_metrics_writer_flushes_validations_at_once_and_jsonl_always(tmp_path):
    writer = MetricsWriter(tmp_path)
    tb = next((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    writer.write({"split": "train", "step": 20, "epoch": 0, "loss": 0.5, "lr": 0.1, "time": 1.0})
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1  # the durable record: flushed
    assert records(tb) == 1  # the train event is queued
    writer.write({"split": "val", "step": 20, "epoch": 0, "loss": 0.4, "samples": 99, "time": 2.0})
    assert records(tb) == 3  # the validation, and the train event queued before it
    writer.close()
