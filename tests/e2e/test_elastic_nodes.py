"""Elastic jobs (``--nnodes 1:2``): a lost node costs seconds, not the job and not a step; a node that comes back is
admitted; under FSDP the job goes on from its latest checkpoint. Each node is an ``mgpu launch`` on this machine in a
working directory of its own, meeting at a c10d endpoint on 127.0.0.1 (node 0's launcher hosts it: the node lost is
node 1), the run dir on storage both share. Node 1's worker is held asleep in step 40 by a test-only fault; once node
0's worker waits for it in that step's gradient all-reduce, node 1's launcher and worker are SIGKILLed: the last step
both ranks completed is 39. (Which node's worker is rank 0 is c10d's choice, by launcher pid: either way.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from mgpucli.launch.ports import answers
from tests.e2e.test_elastic_resume import QUICK_TOL, RECORDING, assert_weights_close, served
from tests.e2e.test_launch import Launch, wait_until
from tests.procs import RECIPES, free_port, load_ckpt, mgpu

QUICK = str(RECIPES / "quickstart.yaml")
# One epoch of the quickstart recipe: 4096 samples, a global batch of 64 (2 x 32 x 1, or 1 x 32 x 2): 64 steps, no
# padding, so every sample is trained exactly once.
COMMON = ["trainer.epochs=1", "trainer.cpu_threads=1", "trainer.log_every=5"]
LOST_IN = 40  # the step node 1 is lost in
HELD = "hold_step@step=50"  # node 0, alone after the loss, holds there until the job grows back
EPOCH_ORDER = torch.randperm(4096, generator=torch.Generator().manual_seed(0)).tolist()  # seed 0, epoch 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The same run on 2 processes, never interrupted: its final weights."""
    cwd = tmp_path_factory.mktemp("whole")
    done = mgpu("launch", "--cpu", "--nproc", "2", QUICK, *COMMON, "run_dir=whole", cwd=cwd, timeout=300)
    assert done.returncode == 0, done.output
    return load_ckpt(cwd / "whole/checkpoints/last.pt")["model"]


class Job:
    """The nodes of one elastic job under ``root``: their shared run dir and record of the samples served."""

    def __init__(self, root: Path, tag: str, *extra: str):
        self.root, self.tag, self.port = root, tag, free_port()
        self.run_dir, self.seen = root / "shared" / "run", root / "shared" / "seen"
        self.args = ["--cpu", "--nproc", "1", "--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{self.port}", QUICK,
                     *COMMON, f"run_dir={self.run_dir}", "data.train._target_=seen_data.Recorded",
                     f"+data.train.record_dir={self.seen}", *extra]
        self.nodes: list[Launch] = []

    def start(self, rank: int, name: str, env: dict[str, str] | None = None) -> Launch:
        cwd = self.root / f"node{rank}"
        cwd.mkdir(exist_ok=True)
        (cwd / "seen_data.py").write_text(RECORDING)
        node = Launch(["--node-rank", str(rank), *self.args], cwd, self.tag, env=env or {}, name=name)
        self.nodes.append(node)
        return node

    def lose_node_1_in_step_40(self, node0: Launch, node1: Launch) -> float:
        """SIGKILL node 1 (launcher and worker) once node 0's worker waits for it in step 40's all-reduce (node 1's is
        asleep in that step's forward); when it was."""
        def node0_waits() -> bool:
            for path in self.run_dir.glob("logs/*/attempt_0/0/mgpu_progress.json"):
                with open(path) as fh:
                    seen = json.loads(fh.read() or "{}")
                if seen.get("step") == LOST_IN and str(seen.get("phase")).startswith("backward"):
                    return True
            return False

        assert wait_until(node0_waits, 180), node0.output + node1.output
        workers = node1.workers()
        assert len(workers) == 1, workers
        killed = time.time()
        for pid in (node1.pid, *workers.values()):
            os.kill(pid, signal.SIGKILL)
        return killed

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


def _start_lost_job(tmp_path: Path, tag: str, *extra: str, node0_env: dict[str, str] | None = None):
    job = Job(tmp_path, tag, *extra)
    node0 = job.start(0, "node0", node0_env)
    # the endpoint's store is the first launcher's here (every one is on the endpoint's host): node 0's, not node 1's
    assert wait_until(lambda: answers("127.0.0.1", job.port), 120), node0.output
    node1 = job.start(1, "node1", {"MGPU_FAULT": f"sleep@step={LOST_IN}", "MGPU_FAULT_SLEEP": "300",
                                   "MGPU_FAULT_ONCE": str(tmp_path / "fault-once")})
    return job, node0, node1


def _trained_once_each(seen: Path, lost_step: int) -> None:
    """Every sample served once, but the 64 of the step in progress when node 1 was lost: loaded by both ranks then,
    never trained, and trained after the restart (none skipped, none trained twice)."""
    counts = Counter(served(seen))
    in_progress = set(EPOCH_ORDER[(lost_step - 1) * 64:lost_step * 64])
    assert {i for i, n in counts.items() if n == 2} == in_progress
    assert sorted(counts) == list(range(4096)) and set(counts.values()) == {1, 2}


def _seconds_to_training(run_dir: Path, killed: float, attempt: int = 1) -> float:
    """From the kill to node 0's next attempt's start mark (its training started again)."""
    (mark,) = run_dir.glob(f"logs/*/attempt_{attempt}/0/mgpu_started")
    return float(mark.read_text().splitlines()[0]) - killed


LOST_LINE = re.compile(r"mgpu launch: node 1 lost at step 40; continuing on 1 node x 1 process\(es\) after step 39, "
                       r"the last step every rank completed: global batch 64 = 1 x 32 x grad_accum 2; 0 steps lost, "
                       r"[\d.]+ s without training\.")


def test_a_lost_node_costs_no_step_and_one_that_comes_back_is_admitted_and_the_job_grows_back(tmp_path: Path, tag: str,
                                                                                                  uninterrupted):
    """Node 1 is lost in step 40: node 0 goes on alone from step 39 with no step lost (and holds at step 50); node 1
    comes back and is admitted: the job ends on 2 nodes with the uninterrupted run's weights, each sample trained
    once. (A survivor that finishes alone: test_under_fsdp_....)"""
    job, node0, node1 = _start_lost_job(tmp_path, tag, node0_env={"MGPU_FAULT": HELD, "MGPU_FAULT_SLEEP": "300"})
    try:
        killed = job.lose_node_1_in_step_40(node0, node1)
        assert wait_until(lambda: LOST_LINE.search(node0.output), 120), node0.output
        again = job.start(1, "node1-again")
        assert node0.wait(timeout=240) == 0, node0.output
        assert again.wait(timeout=60) == 0, again.output
    finally:
        job.cleanup()
    assert re.search(r"mgpu: rank \d lost its connection to another rank; kept step 39, the last step every rank "
                     r"completed", node0.output), node0.output
    print(f"from the kill to training again: {_seconds_to_training(job.run_dir, killed):.1f} s")
    change = _node_record(job.run_dir, 0)["attempts"][1]["membership"]
    assert (change["lost"], change["completed"], change["resumed_after"], change["steps_lost"]) == \
        (["node 1"], 39, 39, 0)
    assert ("mgpu launch: node 1 joined; continuing on 2 nodes x 1 process(es) after step 51, the last step every rank "
            "completed: global batch 64 = 2 x 32 x grad_accum 1; 0 steps lost") in node0.output, node0.output
    final = load_ckpt(job.run_dir / "checkpoints/last.pt")
    assert final["step"] == 64 and [(s["first_step"], s["world_size"], s["nodes"]) for s in final["segments"]] == \
        [(1, 2, 2), (40, 1, 1), (52, 2, 2)]
    assert_weights_close(uninterrupted, final["model"], QUICK_TOL)
    _trained_once_each(job.seen, LOST_IN)
    events = [json.loads(line) for line in (job.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(e["step"], e["nodes"], e["grad_accum"]) for e in events if e.get("event") == "segment"] == \
        [(0, 2, 1), (39, 1, 2), (51, 2, 1)]
    said = _doctor(job.run_dir)
    assert ("trained: steps 1-39 on 2 nodes x 1 process(es) (global batch 64 = 2 x 32 x grad_accum 1), steps 40-51 on "
            "1 node x 1 process(es) (global batch 64 = 1 x 32 x grad_accum 2), steps 52-64 on 2 nodes x 1 process(es) "
            "(global batch 64 = 2 x 32 x grad_accum 1)") in said, said
    assert "nodes: node 1 lost at step 40" in said and "nodes: node 1 joined" in said, said


def test_under_fsdp_the_job_goes_on_from_the_latest_checkpoint_and_says_so(tmp_path: Path, tag: str):
    job, node0, node1 = _start_lost_job(tmp_path, tag, "trainer.strategy=fsdp", "trainer.checkpoint_every_steps=15")
    try:
        job.lose_node_1_in_step_40(node0, node1)
        assert node0.wait(timeout=240) == 0, node0.output
    finally:
        job.cleanup()
    assert "did not keep step 39: under FSDP each rank holds only its shards, and the lost node's are gone" in \
        node0.output, node0.output
    assert ("node 1 lost at step 40; continuing on 1 node x 1 process(es) from its latest checkpoint, after step 30; "
            "under FSDP the lost node's shards of the steps since went with it: global batch 64 = 1 x 32 x grad_accum "
            "2; 9 steps lost") in node0.output, node0.output
    assert load_ckpt(job.run_dir / "checkpoints/last.dcp")["step"] == 64  # sharded, FSDP's default


def test_a_node_range_the_global_batch_cannot_span_is_refused_at_launch(tmp_path: Path):
    endpoint = f"127.0.0.1:{free_port()}"
    refused = mgpu("launch", "--cpu", "--nproc", "1", "--nnodes", "2:3", "--rdzv-endpoint", endpoint, QUICK,
                   cwd=tmp_path, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.output, refused.output
    assert ("--nnodes 2:3: the global batch 96 (the recipe's on 3 nodes) cannot be kept with a whole "
            "trainer.grad_accum on 2 node(s) (96 / (2 x 1 x 32) = 1.5)") in refused.stderr, refused.stderr
    assert "data.batch_size=16 trainer.grad_accum=2" in refused.stderr
    static = mgpu("launch", "--cpu", "--nproc", "1", "--nnodes", "1:2", "--node-rank", "0", "--master-addr",
                  "127.0.0.1", "--master-port", str(free_port()), QUICK, cwd=tmp_path, timeout=120)
    assert static.returncode == 2 and "--rdzv-endpoint HOST:PORT" in static.stderr, static.output
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_two_c10d_nodes_on_one_host_keep_a_record_each_and_the_doctor_reads_both(tmp_path: Path, tag: str):
    """c10d ranks the nodes itself, so each node's launch record is named after its launcher, not its host: two
    nodes on one machine (each in a directory of its own, the run dir shared) write two records, and
    ``mgpu doctor RUN_DIR`` reads them both and shows each node."""
    port, run_dir = free_port(), tmp_path / "shared" / "run"
    args = ["--cpu", "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", QUICK,
            "trainer.epochs=1", "trainer.cpu_threads=1", "data.train.num_samples=256", "data.val.num_samples=64",
            f"run_dir={run_dir}"]
    nodes = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            nodes.append(Launch(args, tmp_path / name, tag, name=name))
            if name == "a":  # the endpoint's store is the first launcher's
                assert wait_until(lambda: answers("127.0.0.1", port), 120), nodes[0].output
        assert [node.wait(timeout=240) for node in nodes] == [0, 0], "\n".join(node.output for node in nodes)
    finally:
        for node in nodes:
            node.cleanup()
    records = {path.name: json.loads(path.read_text()) for path in run_dir.glob("launch*.json")}
    assert len(records) == 2 and "launch.json" not in records, sorted(records)
    assert len({r["host"] for r in records.values()}) == 1  # one host: the names differ all the same
    done = mgpu("doctor", str(run_dir), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.output
    for name, record in records.items():
        assert f"pid {record['pid']}: rank" in done.stderr and f"succeeded ({name})" in done.stderr, done.output


def _node_record(run_dir: Path, node_rank: int) -> dict:
    """The launch record of the node the job gave ``node_rank`` (c10d names the records after their launchers)."""
    records = [json.loads(path.read_text()) for path in run_dir.glob("launch*.json")]
    (found,) = [r for r in records if r.get("node_rank") == node_rank]
    return found


def _doctor(run_dir: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "mgpucli", "doctor", str(run_dir)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    return " ".join((done.stdout + done.stderr).split())
