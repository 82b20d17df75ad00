"""mgpu's own TensorBoard event writer, read back with TensorBoard's reader and protobuf classes."""

from __future__ import annotations

import struct

import pytest

from mgpucli.engine import tbevents
from mgpucli.engine.rundir import MetricsWriter

tensorboard = pytest.importorskip("tensorboard", reason="the tensorboard extra (requirements.txt installs it)")


def test_crc32c_known_values():
    # RFC 3720 appendix B.4 and the usual check value.
    assert tbevents.crc32c(b"123456789") == 0xE3069283
    assert tbevents.crc32c(bytes(32)) == 0x8A9136AA
    assert tbevents.crc32c(bytes([0xFF] * 32)) == 0x62A8AB43
    assert tbevents.crc32c(bytes(range(32))) == 0x46DD794E


def test_masked_crc_matches_tensorboards():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    for data in (b"", b"a", b"123456789", bytes(range(256)) * 3):
        assert tbevents.masked_crc32c(data) == masked_crc32c(data)


@pytest.mark.parametrize("step", [0, 1, 127, 128, 300_000, 2**40, -1])
def test_events_parse_as_tensorboard_protobufs(step):
    from tensorboard.compat.proto.event_pb2 import Event

    ev = Event.FromString(tbevents.event(1234.5, step, scalars={"train/loss": 0.25, "val/accuracy": 1.0}))
    assert (ev.wall_time, ev.step) == (1234.5, step)
    assert [(v.tag, v.simple_value) for v in ev.summary.value] == [("train/loss", 0.25), ("val/accuracy", 1.0)]
    first = Event.FromString(tbevents.event(1.0, file_version="brain.Event:2"))
    assert first.file_version == "brain.Event:2" and not first.HasField("summary")


def test_record_framing():
    data = b"some event bytes"
    rec = tbevents.record(data)
    (length,) = struct.unpack("<Q", rec[:8])
    assert length == len(data) and rec[12:12 + length] == data and len(rec) == 8 + 4 + length + 4


def test_tensorboard_reads_what_metrics_writer_wrote(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = MetricsWriter(tmp_path)
    for step in (20, 40):
        writer.write({"split": "train", "step": step, "epoch": 0, "loss": 1.0 / step, "accuracy": 0.5,
                      "lr": 0.1, "samples_per_s": 1000.0, "time": 1700000000.0 + step})
    writer.write({"split": "val", "step": 40, "epoch": 0, "loss": 0.75, "samples": 99, "time": 1700000050.0})
    writer.close()

    files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/accuracy", "train/lr", "train/samples_per_s", "val/loss", "val/samples"} <= tags
    assert [(e.step, e.wall_time) for e in acc.Scalars("train/loss")] == [(20, 1700000020.0), (40, 1700000040.0)]
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([0.05, 0.025])
    assert [(e.step, e.value) for e in acc.Scalars("val/samples")] == [(40, 99.0)]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3


def test_tensorboard_reader_checks_our_crcs(tmp_path):
    """A corrupted byte is caught by TensorBoard's CRC check: the CRCs we write are the ones it verifies."""
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    writer = tbevents.ScalarWriter(tmp_path)
    writer.add_scalars(5, {"train/loss": 2.0})
    writer.close()
    good = writer.path.read_bytes()
    reader = PyRecordReader_New(str(writer.path))
    reader.GetNext()
    reader.GetNext()  # both records read, CRCs checked
    bad = bytearray(good)
    bad[-6] ^= 0x01  # inside the last record's data
    writer.path.write_bytes(bytes(bad))
    reader = PyRecordReader_New(str(writer.path))
    reader.GetNext()
    with pytest.raises(errors.DataLossError):
        reader.GetNext()
