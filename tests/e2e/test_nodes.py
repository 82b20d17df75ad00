"""Several nodes around the happy path: nodes that run different jobs, a node whose peer never comes, a node lost in
training. Each node is an ``mgpu launch`` on this machine, in a working directory of its own, with the variables a
2-pod PyTorchJob gives its pods (``PET_*``, static or c10d), on 127.0.0.1 and a free port."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.test_launch import LONG, Launch, rank0_log, wait_until
from tests.procs import free_port, proc_state

SCRIPT = Path(__file__).parent / "scripts" / "torchrun_style.py"
WAITING = re.compile(r"mgpu launch: waiting for the nodes to meet at 127\.0\.0\.1:\d+: 1 of 2 here \(node 0\); "
                     r"missing: node 1; \d+m\d+s left \(--join-timeout \d+\)")


BACKENDS = ("static", "c10d")


def node_env(backend: str, node_rank: int, port: int) -> dict[str, str]:
    """What a PyTorchJob's operator sets in pod ``node_rank`` of 2 pods x 1 process (static: the master's address and
    port; c10d: the rendezvous endpoint)."""
    env = {"PET_NNODES": "2", "PET_NODE_RANK": str(node_rank), "PET_NPROC_PER_NODE": "1"}
    if backend == "c10d":
        return {**env, "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}"}
    return {**env, "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}


def start_node(args: list[str], root: Path, name: str, tag: str, env: dict[str, str]) -> Launch:
    """One node: its own working directory under ``root``, its own copy of the test script."""
    cwd = root / name
    cwd.mkdir()
    shutil.copy(SCRIPT, cwd / SCRIPT.name)
    return Launch(args, cwd, tag, env=env, name=name)


def doctor(run_dir: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "mgpucli", "doctor", str(run_dir)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    return done.stdout + done.stderr


def test_nodes_whose_recipes_differ_meet_and_both_stop_with_exit_2_naming_the_key(tmp_path: Path, tag: str):
    port = free_port()
    args = ["--cpu", "--nproc", "1", "quickstart", "name=k8s", "trainer.epochs=1"]
    nodes = [start_node([*args, *(["optim.lr=0.2"] if rank else [])], tmp_path, f"node{rank}", tag,
                        node_env("static", rank, port)) for rank in (0, 1)]
    try:
        codes = [node.wait(timeout=60) for node in nodes]
    finally:
        for node in nodes:
            node.cleanup()
    for node in nodes:  # every node says the same: the key, each node's value
        assert "optim.lr: 0.05 on node 0, 0.2 on node 1" in node.output, node.output
        assert "Traceback" not in node.output and "[rank" not in node.output  # no worker started
    assert codes == [2, 2], "\n".join(node.output for node in nodes)
    run_dir = tmp_path / "node0" / "runs" / "k8s"
    result = json.loads((run_dir / "launch.json").read_text())["result"]
    assert result["status"] == "refused" and result["rendezvous"]["differences"][0]["values"] == {
        "node 0": "0.05", "node 1": "0.2"}
    said = doctor(run_dir)
    assert "did not start: refused: the nodes met, but their jobs differ: optim.lr: 0.05 on node 0" in said, said


def _lone(backend: str, root: Path, name: str, tag: str, *extra: str, node_rank: int = 0) -> Launch:
    return start_node(["--cpu", "--nproc", "1", *extra, SCRIPT.name], root, name, tag,
                      node_env(backend, node_rank, free_port()))


def test_a_lone_node_says_who_it_waits_for_and_stops_on_a_signal_or_its_join_timeout(tmp_path: Path, tag: str):
    """Static and c10d side by side: one 30 s wait serves both."""
    nodes = {backend: (_lone(backend, tmp_path, f"{backend}-sigterm", tag),
                       _lone(backend, tmp_path, f"{backend}-ctrl-c", tag),
                       _lone(backend, tmp_path, f"{backend}-timeout", tag, "--join-timeout", "15"))
             for backend in BACKENDS}
    started = time.monotonic()
    try:
        for terminated, interrupted, _ in nodes.values():
            for node in (terminated, interrupted):  # the first line comes ~5 s into the wait
                assert wait_until(lambda n=node: WAITING.search(n.output), 60), node.output
            os.killpg(interrupted.pid, signal.SIGINT)  # Ctrl-C on a terminal
            assert interrupted.wait(timeout=10) == 130, interrupted.output
        for _, _, timed_out in nodes.values():
            assert timed_out.wait(timeout=90) == 1, timed_out.output
        time.sleep(max(0.0, 30 - (time.monotonic() - started)))  # still waiting, still listening after 30 s
        for terminated, _, _ in nodes.values():
            assert terminated.proc.poll() is None, terminated.output
            os.kill(terminated.pid, signal.SIGTERM)  # a pod deletion, a scheduler's cancel
            assert terminated.wait(timeout=10) == 143, terminated.output
    finally:
        for node in [node for trio in nodes.values() for node in trio]:
            node.cleanup()
    for terminated, interrupted, timed_out in nodes.values():
        _assert_lone_stops(terminated, interrupted, timed_out)


def _assert_lone_stops(terminated: Launch, interrupted: Launch, timed_out: Launch) -> None:
    assert "stopped by SIGTERM" in terminated.output and "while the nodes met: waiting for the nodes" in \
        terminated.output
    assert "stopped by SIGINT" in interrupted.output
    assert "did not meet at 127.0.0.1" in timed_out.output and "node 1 never joined" in timed_out.output
    assert "the same mgpu launch command" in timed_out.output  # what to check
    for node in (terminated, interrupted, timed_out):
        assert "Traceback" not in node.output and "[rank" not in node.output, node.output
    (run_dir,) = (timed_out.cwd / "runs").iterdir()
    said = doctor(run_dir)
    assert "did not start: the nodes never met at 127.0.0.1" in said and "node 1 never joined" in said, said


def test_a_node_whose_store_never_answers_says_so_and_stops_on_sigterm(tmp_path: Path, tag: str):
    """Node 1 of a static job: node 0 hosts the store, and never comes."""
    node = _lone("static", tmp_path, "node1", tag, node_rank=1)
    try:
        assert wait_until(lambda: "its rendezvous store does not answer yet (node 0's launcher hosts it)" in
                          node.output, 60), node.output
        os.kill(node.pid, signal.SIGTERM)
        assert node.wait(timeout=10) == 143, node.output
    finally:
        node.cleanup()
    assert "Traceback" not in node.output and "TCPStore" not in node.output, node.output  # torch's client is quiet


LOST = re.compile(r"mgpu launch: node 1 lost at step \d+; waiting for it to rejoin at 127\.0\.0\.1:\d+: "
                  r"1 of 2 here \(node 0\); \d+m\d+s left")


def test_a_node_lost_in_training_is_named_and_waited_for_aloud_until_sigterm(tmp_path: Path, tag: str):
    """Static and c10d side by side. The survivor names the lost node within 15 s and is still waiting, listening
    for its signal; the line's cadence (every 30 s, counting down) is Meeting's: tests/unit/test_nodes.py."""
    pairs: dict[str, tuple[Launch, Launch]] = {}
    doomed: list[int] = []
    try:
        for backend in BACKENDS:
            pairs[backend] = _survivor_and_lost(tmp_path / backend, tag, backend)
        for survivor, lost in pairs.values():
            assert wait_until(lambda s=survivor: (log := rank0_log(s.cwd / "runs" / "lost")) and
                              re.search(r"step \d+ epoch", log.read_text()), 120), survivor.output + lost.output
        for _, lost in pairs.values():
            killed = [lost.pid, *lost.workers().values()]
            for pid in killed:  # the node goes away at once: its launcher and its worker
                os.kill(pid, signal.SIGKILL)
            doomed += killed
        for survivor, _ in pairs.values():
            assert wait_until(lambda s=survivor: LOST.search(s.output), 15), survivor.output  # named within 15 s
        for survivor, _ in pairs.values():
            assert survivor.proc.poll() is None, survivor.output  # still waiting for node 1
            os.kill(survivor.pid, signal.SIGTERM)
            assert survivor.wait(timeout=10) == 143, survivor.output
    finally:
        for node in [node for pair in pairs.values() for node in pair]:
            node.cleanup()
    assert wait_until(lambda: all(proc_state(pid) in (None, "Z") for pid in doomed), 10)
    for survivor, _ in pairs.values():
        said = doctor(survivor.cwd / "runs" / "lost")
        assert "stopped by SIGTERM while the nodes met" in said and "node 1 lost" in said, said


def _survivor_and_lost(root: Path, tag: str, backend: str) -> tuple[Launch, Launch]:
    """Two nodes of one job in training; the c10d endpoint's host (node 0) hosts the store, not the node to be
    lost."""
    root.mkdir()
    port = free_port()
    args = ["--cpu", "--nproc", "1", "--max-restarts", "3", "quickstart", "name=lost", *LONG]
    survivor = start_node(args, root, "node0", tag, node_env(backend, 0, port))
    if backend == "c10d":
        assert wait_until(lambda: WAITING.search(survivor.output), 60), survivor.output
    return survivor, start_node(args, root, "node1", tag, node_env(backend, 1, port))
