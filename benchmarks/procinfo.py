"""What a benchmarked process reports about itself at the end (stdlib only: the probe and the loop share it)."""

from __future__ import annotations

import os


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) per thread name, from /proc/self/task (empty where that doesn't exist)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for task in sorted(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{task}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def process_start_time() -> float | None:
    """When this process started, as a Unix time (Linux: start ticks after boot; 10 ms resolution).

    The boot time comes from ``time.time() - /proc/uptime`` now, not /proc/stat's ``btime``: in a VM whose clock
    was stepped after boot, ``btime`` is off by that step (by more than a second here)."""
    import time

    try:
        with open("/proc/self/stat") as fh:
            stat = fh.read()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError):
        return None
    ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def rss_mb() -> float:
    """This process's resident memory now, in MiB (Linux /proc/self/statm; 0 where that doesn't exist)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def pin_to_core() -> int | None:
    """With MGPU_BENCH_PIN=1, keep this worker (and the threads it starts) on core LOCAL_RANK mod cores: both
    sides of the benchmark call it at start-up, so a rank's steps don't migrate between cores. Returns the core."""
    if os.environ.get("MGPU_BENCH_PIN") != "1" or "LOCAL_RANK" not in os.environ:
        return None
    try:
        cores = sorted(os.sched_getaffinity(0))
        core = cores[int(os.environ["LOCAL_RANK"]) % len(cores)]
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError, ValueError):
        return None
    return core


def experiments() -> set[str]:
    """The diagnostics asked of this process: MGPU_BENCH_EXPERIMENT=a,b (the probe's on mgpu's side,
    ``mgpu-imports`` on the hand-written loop's)."""
    return set(filter(None, os.environ.get("MGPU_BENCH_EXPERIMENT", "").split(",")))


def spin_seconds(experiment: str) -> float | None:
    """``spin-US`` (the hand-written loop's calibration: US microseconds of busy CPU a step) in seconds; None for
    any other name, a malformed one included."""
    before, spin, us = experiment.partition("spin-")
    if before or not spin or not us.replace(".", "", 1).isdigit():
        return None
    return float(us) / 1e6
