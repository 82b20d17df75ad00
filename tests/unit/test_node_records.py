"""Every node's launch record in a shared run dir is found and read, whatever its name, and only the latest job's
(mgpucli/run_records/node_records.py, mgpu doctor RUN_DIR's reader and report)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mgpucli.postmortem import diagnose_run
from mgpucli.postmortem.report import node_line
from mgpucli.run_records.node_records import job_records


def record(host: str, pid: int, ranks: list[int], met: list[str], rendezvous: str = "job-1",
           status: str = "succeeded", node_rank: int | None = None) -> dict:
    """A node's launch record: its last attempt's ranks, and the records of the nodes it met (``met``)."""
    files = {str(r): {"rank": r, "local_rank": i, "stdout": "", "stderr": "", "error_file": ""}
             for i, r in enumerate(ranks)}
    nodes = [{"node": name, "host": host, "pid": pid, "record": name} for name in met]
    return {"mgpu_version": "0.1.0", "argv": ["mgpu", "launch", "--nnodes", "1:2", "r.yaml"], "host": host, "pid": pid,
            "node_rank": node_rank, "nnodes": 2, "devices": {"kind": "cpu", "nproc_per_node": len(ranks)},
            "rendezvous": {"backend": "c10d", "endpoint": "h:1", "id": rendezvous},
            "attempts": [{"attempt": 0, "dir": "", "ranks": files, "exits": {}, **({"nodes": nodes} if met else {})}],
            "result": {"status": status, "exit_code": 0 if status == "succeeded" else 1}}


def write(run_dir: Path, name: str, data: dict, when: float) -> str:
    path = run_dir / name
    path.write_text(json.dumps(data))
    os.utime(path, (when, when))
    return str(path)


def names(found: list) -> list[str]:
    return [os.path.basename(path) for path, _ in found]


def test_the_nodes_that_met_are_one_job_and_an_earlier_jobs_records_are_not(tmp_path: Path):
    """Two c10d nodes on one host, twice in the same run dir (the same rendezvous id: derived from the endpoint)."""
    earlier = ["launch.box-aaaaaa.json", "launch.box-bbbbbb.json"]
    latest = ["launch.box-cccccc.json", "launch.box-dddddd.json"]
    write(tmp_path, earlier[0], record("box", 10, [0], earlier, status="failed"), 1000)
    old = write(tmp_path, earlier[1], record("box", 11, [1], earlier, status="failed"), 1001)
    write(tmp_path, latest[0], record("box", 20, [1], latest), 2000)  # rank 1 this time
    write(tmp_path, latest[1], record("box", 21, [0], latest), 2001)
    assert names(job_records(str(tmp_path))) == [latest[1], latest[0]]  # the node that held rank 0 first
    assert names(job_records(str(tmp_path), chosen=old)) == earlier  # the job of the record asked for
    report = diagnose_run(str(tmp_path))
    assert report.exit_code == 0 and [n["record"] for n in report.nodes] == [latest[1], latest[0]]
    assert [node_line(n) for n in report.nodes] == [f"box, pid 21: rank 0, succeeded ({latest[1]})",
                                                    f"box, pid 20: rank 1, succeeded ({latest[0]})"]


def test_records_that_name_no_node_are_read_as_before(tmp_path: Path):
    """Records written before nodes named each other: a static job's by node rank; others by rendezvous id."""
    static = tmp_path / "static"
    static.mkdir()
    write(static, "launch.json", record("a", 1, [0, 1], [], node_rank=0), 100)
    write(static, "launch.node1.json", record("b", 2, [2, 3], [], node_rank=1), 101)
    assert names(job_records(str(static))) == ["launch.json", "launch.node1.json"]
    c10d = tmp_path / "c10d"
    c10d.mkdir()
    write(c10d, "launch.box.json", record("box", 1, [0], [], rendezvous="other"), 100)
    write(c10d, "launch.a.json", record("a", 2, [1], []), 101)
    write(c10d, "launch.b.json", record("b", 3, [0], []), 102)
    assert names(job_records(str(c10d))) == ["launch.b.json", "launch.a.json"]


def test_a_node_that_met_the_job_but_keeps_its_record_elsewhere_is_named(tmp_path: Path):
    met = ["launch.box-aaaaaa.json", "launch.other-bbbbbb.json"]
    write(tmp_path, met[0], record("box", 10, [0], met), 100)
    report = diagnose_run(str(tmp_path))
    assert [node_line(n) for n in report.nodes][1] == \
        "launch.other-bbbbbb.json: not in this run dir (a node that does not share it keeps its own)"


def test_a_job_of_one_node_lists_no_nodes(tmp_path: Path):
    write(tmp_path, "launch.json", record("box", 10, [0, 1], []), 100)
    assert diagnose_run(str(tmp_path)).nodes == []
