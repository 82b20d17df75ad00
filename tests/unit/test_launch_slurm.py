"""SLURM node lists and variables (pure)."""

from __future__ import annotations

import pytest

from mgpucli.errors import UsageError
from mgpucli.launch.slurm import default_port_for_job, expand_nodelist, read_slurm


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a,b", ["a", "b"]),
        ("gpu[1-2]-ib,login", ["gpu1-ib", "gpu2-ib", "login"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("x[3],y[5-6]", ["x3", "y5", "y6"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[01-", "node]1[", "node[3-1]", "node[a-b]", "node[1,,2]", ""])
def test_bad_nodelist_is_a_usage_error(bad):
    with pytest.raises(UsageError) as info:
        expand_nodelist(bad)
    assert "--master-addr" in str(info.value)


def test_outside_slurm():
    assert read_slurm({"HOME": "/root"}) is None


def test_read_slurm_job_variables():
    info = read_slurm({"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "node[01-03,07]",
                       "SLURMD_NODENAME": "node07", "SLURM_NODEID": "9"})
    assert (info.nnodes, info.node_rank, info.master_addr) == (4, 3, "node01")  # position in the list wins
    assert info.master_port == default_port_for_job("77") == 10077
    assert info.rdzv_id == "slurm-77"


def test_step_variables_win_inside_srun():
    info = read_slurm({"SLURM_JOB_ID": "12", "SLURM_NNODES": "4", "SLURM_JOB_NODELIST": "n[1-4]",
                       "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "n[3-4]", "SLURMD_NODENAME": "n4",
                       "SLURM_STEP_ID": "0"})
    assert (info.nnodes, info.node_rank, info.master_addr, info.rdzv_id) == (2, 1, "n3", "slurm-12.0")


def test_node_id_fallback_and_port_range():
    info = read_slurm({"SLURM_JOBID": "123456789", "SLURM_NNODES": "2", "SLURM_NODELIST": "a,b", "SLURM_NODEID": "1"})
    assert info.node_rank == 1
    assert 10000 <= info.master_port < 30000
    assert default_port_for_job("123456789") == default_port_for_job("123456789")


def test_bad_node_count():
    with pytest.raises(UsageError):
        read_slurm({"SLURM_JOB_ID": "1", "SLURM_NNODES": "two"})
