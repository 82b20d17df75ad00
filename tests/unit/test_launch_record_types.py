"""launch.json is written from dataclasses and checked against their declared types when read back."""

from __future__ import annotations

import json
from pathlib import Path

from mgpucli.run_records.launch_record import (
    Attempt,
    LaunchFile,
    LaunchHeader,
    LaunchRecord,
    RankFiles,
    RendezvousInfo,
    record_problem,
)


def test_a_written_record_reads_back_as_the_same_dataclasses(tmp_path: Path):
    header = LaunchHeader(mgpu_version="0.1.0", argv=["mgpu", "launch"], rendezvous=RendezvousInfo("c10d", "h:1", "x"))
    record = LaunchRecord(str(tmp_path / "launch.json"), header)
    record.add_attempt(Attempt(0, "logs/a", {1: RankFiles(1, 1, "out", "err", "error.json")}))
    record.set_result("failed", 1, first_failed_rank=1, exitcodes={1: 1})
    record.write()
    data = json.loads((tmp_path / "launch.json").read_text())
    assert data["result"]["exitcodes"] == {"1": 1} and "signal" not in data["result"]  # details that apply only
    assert record_problem(data) is None
    read = LaunchFile.from_json(data)
    assert read.header == header and read.attempts == record.attempts and read.result == record.result


def test_a_record_written_before_the_dataclasses_still_reads():
    old = {"mgpu_version": "0.1.0", "argv": ["mgpu", "launch"], "rendezvous": {"id": "mgpu-1"},
           "devices": {"nproc_per_node": 2}, "env": {}, "attempts": [], "result": {"status": "running"},
           "a_field_of_a_later_version": [1]}
    assert record_problem(old) is None
    read = LaunchFile.from_json(old)
    assert (read.header.rendezvous.id, read.header.devices.nproc_per_node, read.result.status) == ("mgpu-1", 2,
                                                                                                   "running")


def test_a_field_of_another_type_is_named_with_where_it_is():
    data = {"argv": ["mgpu"], "attempts": [], "result": {"status": "failed", "exitcodes": {"0": "one"}}}
    assert record_problem(data) == "its field result.exitcodes.0 is a string, where mgpu launch writes a number"
    data["result"] = {"status": True}
    assert record_problem(data) == "its field result.status is true/false, where mgpu launch writes a string"
