"""Turn a live-test outcome into checks (pure): did it run, were the values right, how fast was all_reduce.

Bandwidth follows nccl-tests: algbw = bytes / time; busbw = algbw x 2(n-1)/n for all_reduce (the traffic
each link really carries, comparable across process counts). Time is the slowest rank's.
"""

from __future__ import annotations

from typing import Any

from mgpucli.doctor.live import LiveOutcome
from mgpucli.doctor.result import CheckResult, fail, ok, skipped, warn

AREA = "live"
COLLECTIVES = ("all_reduce", "broadcast", "all_gather")
SLOW_NCCL_BUSBW = 2.0  # GB/s at the largest size: below this NCCL is on a fallback path (sockets, no SHM/P2P)
HANG_HINTS = {
    "init": "Start-up or rendezvous hung: check GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME and local firewalls; on a "
    "busy machine raise --timeout.",
    "cuda": "A collective hung: rerun with NCCL_DEBUG=INFO to see where; try NCCL_P2P_DISABLE=1 (see IOMMU); on a "
    "busy machine raise --timeout.",
    "cpu": "A collective hung: rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to see which rank stopped; on a busy "
    "machine raise --timeout.",
}


def bus_factor(nproc: int) -> float:
    """nccl-tests' all_reduce bus-bandwidth factor 2(n-1)/n."""
    return 2 * (nproc - 1) / nproc


def bandwidth_rows(outcome: LiveOutcome) -> list[dict[str, float]]:
    """Per size: bytes, slowest rank's seconds, algbw and busbw in GB/s (1e9 bytes, as nccl-tests)."""
    per_rank = [r.get("bandwidth") or [] for r in outcome.reports.values()]
    if len(per_rank) < outcome.nproc or not all(per_rank):
        return []
    rows = []
    for sized in zip(*per_rank, strict=False):
        seconds = max(row["seconds"] for row in sized)
        algbw = sized[0]["bytes"] / seconds / 1e9 if seconds > 0 else 0.0
        rows.append(
            {
                "bytes": sized[0]["bytes"],
                "seconds": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * bus_factor(outcome.nproc),
            }
        )
    return rows


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


def _where(reports: dict[int, dict[str, Any]], nproc: int) -> str:
    return ", ".join(
        f"rank {r} in {reports[r].get('phase', '?')}" if r in reports else f"rank {r} never started"
        for r in range(nproc)
    )


def _errors(outcome: LiveOutcome) -> str:
    errs = [f"rank {r}: {rep['error']}" for r, rep in sorted(outcome.reports.items()) if rep.get("error")]
    if errs:
        return "; ".join(errs)
    lines = [ln for ln in outcome.log_tail.splitlines() if ln.strip()]
    return " | ".join(lines[-3:]) if lines else "no output"


def check_run(outcome: LiveOutcome) -> CheckResult:
    """Did every process start, rendezvous, and finish?"""
    name = "live test"
    what = f"{outcome.nproc} process{'' if outcome.nproc == 1 else 'es'}, "
    what += "nccl on GPUs" if outcome.device == "cuda" else "gloo on CPU"
    if outcome.timed_out:
        stuck = [rep.get("phase") for rep in outcome.reports.values()]
        kind = "init" if len(stuck) < outcome.nproc or "init" in stuck else outcome.device
        where = _where(outcome.reports, outcome.nproc)
        return fail(
            name,
            AREA,
            f"{what}: did not finish within {outcome.timeout:g} s and was killed ({where})",
            HANG_HINTS[kind],
        )
    done = [r for r, rep in outcome.reports.items() if rep.get("phase") == "done"]
    if outcome.returncode != 0 or len(done) < outcome.nproc:
        return fail(
            name,
            AREA,
            f"{what}: the launcher exited with code {outcome.returncode} ({_errors(outcome)})",
            "Read the error; rerun with NCCL_DEBUG=INFO (GPUs) or TORCH_DISTRIBUTED_DEBUG=DETAIL for more detail.",
        )
    return ok(name, AREA, f"{what}, started by torch.distributed.run, finished in {outcome.seconds:.1f} s")


def check_collective(outcome: LiveOutcome, name: str) -> CheckResult:
    results = {r: rep.get("collectives", {}).get(name) for r, rep in outcome.reports.items()}
    wrong = [
        f"rank {r}: {res.get('detail', 'wrong values')}" for r, res in sorted(results.items()) if res and not res["ok"]
    ]
    if wrong:
        return fail(
            name,
            AREA,
            "; ".join(wrong),
            "Wrong results from a collective point at the interconnect or "
            "driver: rerun with NCCL_P2P_DISABLE=1 and NCCL_DEBUG=INFO to narrow it down.",
        )
    if len(outcome.reports) < outcome.nproc or any(res is None for res in results.values()):
        return skipped(name, AREA, "not reached on every rank (see 'live test')")
    return ok(name, AREA, "correct on the one rank" if outcome.nproc == 1 else f"correct on all {outcome.nproc} ranks")


def check_bandwidth(outcome: LiveOutcome) -> CheckResult:
    name = "all_reduce bandwidth"
    rows = bandwidth_rows(outcome)
    if not rows:
        return skipped(name, AREA, "not measured (see 'live test')")
    if outcome.nproc == 1:
        shown = "; ".join(f"{_size(r['bytes'])}: algbw {r['algbw_gbps']:.2f} GB/s" for r in rows)
        return ok(name, AREA, f"{shown} (one process: busbw n/a)")
    shown = "; ".join(
        f"{_size(r['bytes'])}: algbw {r['algbw_gbps']:.2f}, busbw {r['busbw_gbps']:.2f} GB/s" for r in rows
    )
    if outcome.device == "cuda" and rows[-1]["busbw_gbps"] < SLOW_NCCL_BUSBW:
        return warn(
            name,
            AREA,
            f"{shown}: far below any GPU interconnect",
            "Look for NCCL_P2P_DISABLE / NCCL_SHM_DISABLE and the link matrix above; "
            "NCCL_DEBUG=INFO shows which transport NCCL picked.",
        )
    return ok(name, AREA, shown)


def summarize(outcome: LiveOutcome) -> list[CheckResult]:
    return [check_run(outcome), *(check_collective(outcome, c) for c in COLLECTIVES), check_bandwidth(outcome)]
