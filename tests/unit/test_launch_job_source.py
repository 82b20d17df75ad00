"""Which engine describes the job (pure): SLURM, torchrun's PET_* variables, a Kubernetes pod's, or none."""

from __future__ import annotations

import pytest

from mgpucli.errors import UsageError
from mgpucli.launch.job_source import read_scheduler, unread_torchrun_variables

SLURM = {"SLURM_JOB_ID": "4321", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURMD_NODENAME": "gpu08"}
PET = {"PET_NNODES": "4", "PET_NODE_RANK": "3", "PET_NPROC_PER_NODE": "8", "PET_MASTER_ADDR": "job-master-0",
       "PET_MASTER_PORT": "23456"}
# What a PyTorchJob operator sets per pod (WORLD_SIZE counts pods); KUBERNETES_SERVICE_HOST: inside a pod.
POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
       "WORLD_SIZE": "3", "RANK": "2"}


def shape(env: dict[str, str]):
    job = read_scheduler(env)
    if job is None:
        return None
    return job.name, job.nnodes, job.node_rank, job.master_addr, job.master_port, job.nproc_per_node


@pytest.mark.parametrize(("env", "expected"), [
    ({"HOME": "/root"}, None),
    (SLURM, ("SLURM", 2, 1, "gpu07", 14321, None)),
    (PET, ("torchrun's PET_* variables", 4, 3, "job-master-0", 23456, "8")),
    (POD, ("the pod's variables", 3, 2, "job-master-0", 23456, None)),
    # the documented order: SLURM, then PET_*, then the pod's variables; the first found is read alone
    ({**SLURM, **PET, **POD}, ("SLURM", 2, 1, "gpu07", 14321, None)),
    ({**PET, **POD}, ("torchrun's PET_* variables", 4, 3, "job-master-0", 23456, "8")),
    # one PET_* variable is enough, torchrun's defaults for the rest
    ({"PET_NPROC_PER_NODE": "4"}, ("torchrun's PET_* variables", 1, None, None, 29500, "4")),
    ({**PET, "PET_NNODES": "4:4"}, ("torchrun's PET_* variables", 4, 3, "job-master-0", 23456, "8")),
])
def test_the_engine_that_describes_the_job(env, expected):
    assert shape(env) == expected


@pytest.mark.parametrize("env", [
    # the names torchrun gives every worker, or a shell kept from an earlier job: not a pod
    {k: v for k, v in POD.items() if k != "KUBERNETES_SERVICE_HOST"},
    {**POD, "WORLD_SIZE": "1", "RANK": "0"},  # a pod of a one-node job
    {**POD, "LOCAL_RANK": "0"},  # a worker inside the pod (torch's agent sets LOCAL_RANK)
    {**POD, "TORCHELASTIC_RUN_ID": "x"},
    {**PET, "LOCAL_RANK": "1"},  # a worker inherits the pod's PET_*: it is no launcher
    {**{k: v for k, v in POD.items() if k != "RANK"}},
    {"PET_MAX_RESTARTS": "3"},  # not a variable mgpu reads
])
def test_what_is_not_a_job_to_launch(env):
    assert read_scheduler(env) is None


def test_the_variables_read_are_named_for_messages():
    job = read_scheduler({**PET, **POD})
    assert job.said("node_rank") == "PET_NODE_RANK=3" and job.said("nnodes") == "PET_NNODES=4"
    assert "PET_MASTER_ADDR=job-master-0" in job.describe() and "RANK=2" not in job.describe()
    pod = read_scheduler(POD)
    assert pod.said("nnodes") == "WORLD_SIZE=3" and pod.said("node_rank") == "RANK=2"
    assert read_scheduler(SLURM).said("master_addr") == "SLURM's master address gpu07"


def test_a_c10d_rendezvous_from_the_environment():
    job = read_scheduler({"PET_NNODES": "2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "job-worker-0:29400",
                          "PET_RDZV_ID": "myjob"})
    assert (job.rdzv_endpoint, job.rdzv_id, job.job_id, job.node_rank) == ("job-worker-0:29400", "myjob", "myjob", None)
    static = read_scheduler({**PET, "PET_RDZV_BACKEND": "static", "PET_RDZV_ENDPOINT": "elsewhere:1"})
    assert static.rdzv_endpoint is None  # torchrun's static rendezvous is at the master's address


@pytest.mark.parametrize(("env", "said"), [
    ({**PET, "PET_NNODES": "1:x"}, "PET_NNODES=1:x"),
    ({**PET, "PET_NODE_RANK": "one"}, "PET_NODE_RANK='one'"),
    ({**PET, "PET_MASTER_PORT": "port"}, "PET_MASTER_PORT='port'"),
    ({**PET, "PET_RDZV_BACKEND": "etcd-v2"}, "PET_RDZV_BACKEND=etcd-v2"),
    ({**POD, "WORLD_SIZE": "two"}, "WORLD_SIZE='two'"),
])
def test_a_variable_that_cannot_be_read_is_refused_by_name(env, said):
    with pytest.raises(UsageError) as info:
        read_scheduler(env)
    assert said in info.value.message


def test_the_torchrun_variables_mgpu_does_not_read_are_listed():
    assert unread_torchrun_variables({**PET, "PET_MAX_RESTARTS": "3", "PET_STANDALONE": "1"}) == [
        "PET_MAX_RESTARTS=3", "PET_STANDALONE=1"]


def test_a_short_local_command_gets_none_of_the_pods_torchrun_variables():
    from mgpucli.distributed.select import DeviceSelection
    from mgpucli.launch.spawn import worker_env

    selection = DeviceSelection(kind="cpu", nproc=2, gpu_indices=(), cuda_visible_devices=None)
    env = worker_env(selection, {**PET, "PATH": "/usr/bin"})
    assert env["PATH"] == "/usr/bin" and not [k for k in env if k.startswith("PET_")]
