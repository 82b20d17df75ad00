"""The live test's pure parts: worker environment, launcher command, and reading the outcome."""

from __future__ import annotations

import pytest

from mgpucli.doctor.live import LiveOutcome, live_command, live_env
from mgpucli.doctor.live_summary import bandwidth_rows, bus_factor, summarize
from mgpucli.doctor.observation import Plan

CPU2 = Plan(kind="cpu", nproc=2)
GOOD = {"all_reduce": {"ok": True}, "broadcast": {"ok": True}, "all_gather": {"ok": True}}


def rank_report(rank: int, seconds=(0.001, 0.01), phase="done", collectives=None, **extra) -> dict:
    bw = [{"bytes": b, "seconds": s} for b, s in zip((2**20, 8 * 2**20), seconds, strict=True)]
    return {"rank": rank, "phase": phase, "collectives": GOOD if collectives is None else collectives,
            "bandwidth": bw if phase == "done" else [], **extra}  # fmt: skip


def outcome(reports: dict, rc=0, timed_out=False, nproc=2, device="cpu", log="") -> LiveOutcome:
    return LiveOutcome(nproc, device, 30.0, None if timed_out else rc, timed_out, 3.2, reports, log)


def by_name(results):
    return {r.name: r for r in results}


def test_env_scrubs_stale_launcher_state_and_sets_threads():
    base = {"PATH": "/bin", "RANK": "3", "WORLD_SIZE": "2", "MASTER_PORT": "29500", "PET_NNODES": "4",
            "TORCHELASTIC_RUN_ID": "x", "NCCL_DEBUG": "WARN", "MGPU_FAULT": "sleep@rank=1"}  # fmt: skip
    env = live_env(base, CPU2, cpus=8)
    assert env["OMP_NUM_THREADS"] == "4"
    for gone in ("RANK", "WORLD_SIZE", "MASTER_PORT", "PET_NNODES", "TORCHELASTIC_RUN_ID"):
        assert gone not in env
    assert env["NCCL_DEBUG"] == "WARN" and env["MGPU_FAULT"] == "sleep@rank=1"  # user settings stay
    gpu = live_env({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, Plan("cuda", 2, (1, 3), "1,3"), cpus=8)
    assert gpu["CUDA_VISIBLE_DEVICES"] == "1,3" and "OMP_NUM_THREADS" not in gpu


def test_command_goes_through_torchrun():
    cmd = live_command(CPU2, "/tmp/x", 12.5)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[cmd.index("-m", 3) + 1] == "mgpucli.doctor.live_worker"
    assert cmd[cmd.index("--timeout") + 1] == "13"
    assert cmd[cmd.index("--device") + 1] == "cpu"


def test_bus_factor_matches_nccl_tests():
    assert bus_factor(2) == 1.0
    assert bus_factor(8) == pytest.approx(1.75)
    assert bus_factor(1) == 0.0


def test_all_good():
    results = summarize(outcome({0: rank_report(0), 1: rank_report(1, seconds=(0.002, 0.02))}))
    assert [r.status for r in results] == ["ok"] * 5
    bw = by_name(results)["all_reduce bandwidth"].detail
    assert "1 MiB: algbw 0.52, busbw 0.52 GB/s" in bw  # the slowest rank's time: 2**20 / 0.002 / 1e9


def test_bandwidth_rows_use_slowest_rank_and_bus_factor():
    out = outcome({r: rank_report(r, seconds=(0.001 * (r + 1), 0.01)) for r in range(4)}, nproc=4)
    rows = bandwidth_rows(out)
    assert rows[0]["seconds"] == pytest.approx(0.004)
    assert rows[0]["busbw_gbps"] == pytest.approx(rows[0]["algbw_gbps"] * 1.5)


def test_one_process_reports_algbw_only():
    result = by_name(summarize(outcome({0: rank_report(0)}, nproc=1)))["all_reduce bandwidth"]
    assert result.status == "ok" and "busbw n/a" in result.detail


def test_slow_nccl_warns():
    out = outcome({r: rank_report(r, seconds=(0.01, 0.1)) for r in range(2)}, device="cuda")
    r = by_name(summarize(out))["all_reduce bandwidth"]
    assert r.status == "warn" and "NCCL_DEBUG=INFO" in r.hint


def test_wrong_values_fail_that_collective():
    bad = dict(GOOD, all_reduce={"ok": False, "detail": "all_reduce: 1 of 4096 values wrong"})
    results = by_name(summarize(outcome({0: rank_report(0, collectives=bad), 1: rank_report(1, collectives=bad)})))
    assert results["all_reduce"].status == "fail" and "rank 0: all_reduce: 1 of 4096" in results["all_reduce"].detail
    assert results["broadcast"].status == "ok"


def test_timeout_fails_and_says_where_each_rank_was():
    reports = {0: rank_report(0, phase="all_reduce", collectives={})}
    results = by_name(summarize(outcome(reports, timed_out=True)))
    run = results["live test"]
    assert run.status == "fail" and "within 30 s" in run.detail
    assert "rank 0 in all_reduce" in run.detail and "rank 1 never started" in run.detail
    assert "--timeout" in run.hint and "Start-up or rendezvous hung" in run.hint
    assert results["all_reduce"].status == "skipped"
    assert results["all_reduce bandwidth"].status == "skipped"


def test_hang_in_collective_hint_fits_the_backend():
    reports = {r: rank_report(r, phase="all_reduce", collectives={}) for r in range(2)}
    gpu = summarize(outcome(reports, timed_out=True, device="cuda"))[0]
    assert "A collective hung" in gpu.hint and "NCCL_DEBUG=INFO" in gpu.hint
    cpu = summarize(outcome(reports, timed_out=True))[0]
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in cpu.hint and "NCCL" not in cpu.hint


def test_crash_fails_with_the_error():
    reports = {0: rank_report(0, phase="all_reduce", collectives={}),
               1: rank_report(1, phase="all_reduce", collectives={}, error="RuntimeError: injected fault")}  # fmt: skip
    run = summarize(outcome(reports, rc=1))[0]
    assert run.status == "fail" and "exited with code 1" in run.detail
    assert "rank 1: RuntimeError: injected fault" in run.detail


def test_launcher_failure_without_reports_shows_log():
    run = summarize(outcome({}, rc=1, log="line a\nModuleNotFoundError: No module named 'mgpucli'"))[0]
    assert run.status == "fail" and "ModuleNotFoundError" in run.detail
