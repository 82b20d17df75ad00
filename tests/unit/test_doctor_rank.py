"""Rank setup: launcher variables left in the shell, consistency, LOCAL_RANK vs GPUs, MASTER_PORT."""

from __future__ import annotations

import socket

import pytest

from mgpucli.doctor.checks_rank import check_job, check_master_port, check_rank_variables
from mgpucli.doctor.host import port_status, ports_to_probe
from mgpucli.doctor.observation import HostInfo, Observation, Plan, TorchDevice, TorchInfo


def obs(env: dict[str, str], gpus: int = 0, ports: dict[int, str] | None = None) -> Observation:
    torch = TorchInfo(version="2.13.0", devices=tuple(TorchDevice("GPU", 1) for _ in range(gpus)))
    plan = Plan("cuda", gpus, tuple(range(gpus))) if gpus else Plan("cpu", 2)
    return Observation(env=env, torch=torch, host=HostInfo(ports_in_use=ports or {}), plan=plan)


POD = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}
PET = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4", "PET_MASTER_ADDR": "job-master-0",
       "PET_MASTER_PORT": "23456"}


@pytest.mark.parametrize(("env", "said"), [
    ({}, "one node: no SLURM, torchrun PET_* or Kubernetes pod variables"),
    ({**PET, **POD}, "torchrun's PET_* variables (PET_NNODES=2 PET_NODE_RANK=1 PET_NPROC_PER_NODE=4 "
                     "PET_MASTER_ADDR=job-master-0 PET_MASTER_PORT=23456): mgpu launch would start 2 node(s) x 4 "
                     "process(es) = world size 8; this is node 1; the nodes meet at job-master-0:23456"),
    ({**POD, "KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "the pod's variables (MASTER_ADDR=job-master-0 "
     "MASTER_PORT=23456 WORLD_SIZE=2 RANK=1): mgpu launch would start 2 node(s) x 4 process(es) = world size 8"),
    ({"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n1"},
     "SLURM job 7: mgpu launch would start 2 node(s) x 4 process(es) = world size 8; this is node 0; the nodes meet "
     "at n1:10007"),
    ({"PET_NNODES": "2", "PET_RDZV_ENDPOINT": "job-worker-0:29400"}, "the c10d rendezvous assigns this node's rank; "
     "the nodes meet at job-worker-0:29400"),
])
def test_the_job_names_its_engine_and_the_shape_mgpu_launch_would_start(env, said):
    result = check_job(obs(env, gpus=4))
    assert result.status == "ok" and said in result.detail, result.detail


def test_a_job_that_cannot_be_launched_is_a_failure_naming_the_variables():
    bad = check_job(obs({**PET, "PET_NODE_RANK": "2"}, gpus=4))
    assert bad.status == "fail" and "PET_NODE_RANK=2 is not below PET_NNODES=2" in bad.detail
    unreadable = check_job(obs({**PET, "PET_NNODES": "1:x"}, gpus=4))
    assert unreadable.status == "fail" and "PET_NNODES=1:x" in unreadable.detail
    static = check_job(obs({**PET, "PET_NNODES": "1:4"}, gpus=4))
    assert static.status == "fail" and "An elastic job needs a c10d rendezvous" in static.detail
    elastic = check_job(obs({**PET, "PET_NNODES": "1:4", "PET_RDZV_BACKEND": "c10d",
                             "PET_RDZV_ENDPOINT": "job-master-0:29400"}, gpus=4))
    assert elastic.status == "ok" and "an elastic job of 1 to 4 node(s)" in elastic.detail
    short = check_job(obs(PET, gpus=2))
    assert short.status == "warn" and "torch sees 2 GPU(s)" in short.detail and "PET_NPROC_PER_NODE" in short.hint


def test_a_pods_own_rank_variables_are_the_jobs_not_leftovers():
    assert check_rank_variables(obs({**PET, **POD})).status == "ok"
    assert check_rank_variables(obs({**POD, "KUBERNETES_SERVICE_HOST": "10.96.0.1"})).status == "ok"
    assert check_rank_variables(obs(POD)).status == "warn"  # outside a pod: a shell's leftovers
    leftover = check_rank_variables(obs({**PET, **POD, "LOCAL_RANK": "0"}))  # a worker's: no job to launch
    assert leftover.status == "warn" and "LOCAL_RANK" in leftover.hint


def test_clean_shell_ok():
    assert check_rank_variables(obs({"PATH": "/usr/bin"})).status == "ok"


def test_consistent_leftovers_warn():
    r = check_rank_variables(obs({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5"}))
    assert r.status == "warn"
    assert r.hint == "unset RANK WORLD_SIZE MASTER_ADDR"
    assert "wait for its peers" in r.detail


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 does not fit WORLD_SIZE=2"),
        ({"RANK": "0"}, "WORLD_SIZE is missing"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, "exceeds WORLD_SIZE"),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "does not fit LOCAL_WORLD"),
    ],
)
def test_inconsistent_fails(env, needle):
    r = check_rank_variables(obs(env))
    assert r.status == "fail" and needle in r.detail
    assert r.hint.startswith("unset ")


def test_local_rank_beyond_gpus_fails():
    r = check_rank_variables(obs({"LOCAL_RANK": "3"}, gpus=2))
    assert r.status == "fail" and "cuda:3 does not exist" in r.detail
    assert check_rank_variables(obs({"LOCAL_RANK": "1"}, gpus=2)).status == "warn"


def test_master_port_unset():
    assert check_master_port(obs({}, ports={29500: ""})).status == "ok"
    r = check_master_port(obs({}, ports={29500: "in use"}))
    assert r.status == "warn" and "--standalone" in r.detail


def test_master_port_set():
    assert check_master_port(obs({"MASTER_PORT": "29511"}, ports={29511: ""})).status == "ok"
    taken = check_master_port(obs({"MASTER_PORT": "29511"}, ports={29511: "already in use on this machine"}))
    assert taken.status == "fail" and "unset MASTER_PORT" in taken.hint and ":29511" in taken.hint
    bad = check_master_port(obs({"MASTER_PORT": "70000"}))
    assert bad.status == "fail" and "not a port number" in bad.detail


def test_port_probe_sees_a_bound_socket():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        holder.listen()
        assert "already in use" in port_status(port)
    assert port_status(port) == ""


def test_ports_to_probe():
    assert ports_to_probe({"MASTER_PORT": "1234"}) == [1234, 29500]
    assert ports_to_probe({"MASTER_PORT": "nope"}) == [29500]
