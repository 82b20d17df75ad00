"""``mgpu launch`` in the pods of a Kubernetes job (PyTorchJob / TrainJob, TorchX): two "pods" on this machine,
each with the variables the operator sets (torchrun's ``PET_*`` and the pod's ``MASTER_*``/``WORLD_SIZE``/``RANK``),
each running the same command in the same directory (the shared storage of a real job)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e import test_launch
from tests.e2e.test_launch import SHORT, Launch, assert_same_weights, final_weights
from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import free_port

baseline = test_launch.baseline  # the fixture: the final weights of `--cpu --nproc 2` on one node
short_run = test_launch.short_run  # the fixture baseline reads: that one-node run
SCRIPT = Path(__file__).parent / "scripts" / "torchrun_style.py"


def pod_env(node_rank: int, port: int, nproc: int = 1) -> dict[str, str]:
    """What a PyTorchJob operator sets in pod ``node_rank`` of a 2-pod job (WORLD_SIZE and RANK count pods)."""
    return {"PET_NNODES": "2", "PET_NODE_RANK": str(node_rank), "PET_NPROC_PER_NODE": str(nproc),
            "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(node_rank)}


def run_pods(args: list[str], cwd: Path, tag: str) -> list[Launch]:
    """The same command in both pods, side by side; both must exit 0."""
    port = free_port()
    pods = [Launch(args, cwd, tag, env=pod_env(rank, port), name=f"pod{rank}") for rank in (0, 1)]
    try:
        codes = [pod.wait(timeout=150) for pod in pods]
    finally:
        for pod in pods:
            pod.cleanup()
    assert codes == [0, 0], "\n".join(pod.output for pod in pods)
    return pods


def test_two_pods_train_one_recipe_job_like_one_node_with_two_processes(tmp_path: Path, tag: str, baseline):
    pods = run_pods(["--cpu", "--nproc", "1", "quickstart", "name=k8s", *SHORT], tmp_path, tag)
    run_dir = tmp_path / "runs" / "k8s"  # the recipe's run dir: the same on every pod
    assert "mgpu train k8s: 2 process(es)" in pods[0].output  # rank 0 (pod 0) speaks for the one job
    assert "PET_NODE_RANK=1" in pods[1].output and "2 nodes, node 1" in pods[1].output  # the variables read
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("split") == "train"]
    assert max(steps) == 64  # 4096 samples at 32 x 2 processes: one job, not two jobs of one process (128 steps)
    assert (run_dir / "launch.json").is_file() and (run_dir / "launch.node1.json").is_file()  # no record collides
    assert_same_weights(final_weights(run_dir), baseline)


def test_two_pods_run_one_script_job_in_one_run_dir(tmp_path: Path, tag: str):
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    pods = run_pods(["--cpu", "--nproc", "1", SCRIPT.name], tmp_path, tag)
    (run_dir,) = (tmp_path / "runs").iterdir()  # named from the job, not the clock: both pods chose it
    assert run_dir.name.startswith("torchrun_style-") and not re.search(r"\d{8}-\d{6}", run_dir.name)
    for rank, pod in enumerate(pods):  # each pod shows its local rank 0, global rank 0 and 1
        (said,) = [json.loads(line.split(":", 1)[1]) for line in pod.output.splitlines()
                   if line.startswith(f"[rank{rank}]:{{")]
        assert (said["rank"], said["world"]) == (rank, 2), pod.output
    assert (run_dir / "launch.json").is_file() and (run_dir / "launch.node1.json").is_file()


def test_pod_variables_that_contradict_are_refused_before_anything_starts(tmp_path: Path):
    """The launcher's own refusals and plan, in the test process (a process it started would fail the test)."""
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    port = free_port()
    cases = [({**pod_env(0, port), "PET_NPROC_PER_NODE": "2"}, ["--nproc 1", "PET_NPROC_PER_NODE=2"]),
             (pod_env(2, port), ["PET_NODE_RANK=2 is not below PET_NNODES=2"])]
    for env, said in cases:
        r = cli("launch", "--cpu", "--nproc", "1", SCRIPT.name, cwd=tmp_path, env=env, allowed=(COMPOSE_CHILD,))
        assert r.returncode == 2 and all(s in r.output for s in said), r.output
        assert "Traceback" not in r.output
    assert not (tmp_path / "runs").exists()  # nothing started, no run dir
    r = cli("launch", "--cpu", "--dry-run", "quickstart", cwd=tmp_path, env=pod_env(1, port), allowed=(COMPOSE_CHILD,))
    assert r.returncode == 0, r.output
    assert (f"torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend static --master-addr 127.0.0.1 --master-port "
            f"{port} --node-rank 1 ") in r.stdout
    assert "PET_NPROC_PER_NODE=1" in r.stderr  # which variables it used


def test_the_doctor_in_a_pod_names_the_engine_and_the_job_it_would_launch(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-m", "mgpucli", "doctor", "--quick", "--cpu", "--nproc", "1", "--json"],
                          cwd=tmp_path, env={**env, **pod_env(1, free_port(), nproc=1)}, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    job = checks["job"]
    assert job["status"] == "ok" and "PET_NODE_RANK=1" in job["detail"], job
    assert "2 node(s) x 1 process(es) = world size 2; this is node 1" in job["detail"]
    assert checks["rank variables"]["status"] == "ok"  # the pod's RANK/WORLD_SIZE are its job's, not leftovers
