"""Out of resources: GPU memory, host memory (signals), shared memory (DataLoader workers), ports."""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from typing import Any

from mgpucli.postmortem.lines import LogLine, find_all
from mgpucli.postmortem.matchers.base import Match, first_rank_hits, hit_ranks, scan

# ------------------------------------------------------------------------------------------ CUDA OOM
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation|"
                  r"Failed to CUDA calloc|ran out of GPU memory")
_OOM_TRIED = re.compile(r"Tried to allocate (?P<size>[\d.]+ [KMGT]?i?B)")
_OOM_NEW = re.compile(r"GPU (?P<gpu>\d+) has a total capac(?:i)?ty of (?P<total>[\d.]+ [KMGT]?i?B) of which "
                      r"(?P<free>[\d.]+ [KMGT]?i?B) is free")
_OOM_OLD = re.compile(r"\(GPU (?P<gpu>\d+); (?P<total>[\d.]+ [KMGT]?i?B) total capacity;.*?"
                      r"(?P<free>[\d.]+ [KMGT]?i?B) free")
_OOM_MINE = re.compile(r"this process has (?P<mine>[\d.]+ [KMGT]?i?B) memory in use")
_OOM_RESERVED = re.compile(r"(?P<reserved>[\d.]+ [KMGT]?i?B) is reserved by PyTorch but unallocated")
_AT_STEP = re.compile(r"\bat step (?P<step>\d+)")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def to_bytes(size: str) -> float:
    value, unit = size.split()
    return float(value) * _UNITS.get(unit, 1)


def cuda_oom(lines: Sequence[LogLine]) -> Match | None:
    hits = find_all(lines, _OOM)
    if not hits:
        return None
    anchor = hits[0][0]
    text = " ".join(line.text for line, _ in first_rank_hits(hits))
    details: dict[str, Any] = {"ranks": hit_ranks(hits)}
    for pattern in (_OOM_TRIED, _OOM_NEW, _OOM_OLD, _OOM_MINE, _OOM_RESERVED):
        found = pattern.search(text)
        if found:
            details.update({k: v for k, v in found.groupdict().items() if k not in details})
    if "gpu" in details:
        details["gpu"] = int(details["gpu"])
    fix = ("Lower data.batch_size and raise trainer.grad_accum by the same factor (the global batch and the "
           "results stay the same), use trainer.precision=bf16, or shard the model with trainer.strategy=fsdp.")
    if "reserved" in details and "mine" in details and to_bytes(details["reserved"]) > 0.2 * to_bytes(details["mine"]):
        fix += (f" {details['reserved']} was reserved but unallocated (fragmentation): "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps.")
    if {"total", "free", "mine"} <= details.keys():
        others = to_bytes(details["total"]) - to_bytes(details["free"]) - to_bytes(details["mine"])
        if others > 2**30:
            fix += (f" About {others / 2**30:.1f} GiB of GPU {details.get('gpu', '?')} was used by other "
                    "processes: check nvidia-smi for a leftover job.")
    at_step = _AT_STEP.search(text)
    where = f"GPU {details['gpu']}" if "gpu" in details else "its GPU"
    tried = f" (it tried to allocate {details['size']})" if "size" in details else ""
    return Match("cuda_oom", f"rank {anchor.rank} ran out of memory on {where}{tried}", anchor.rank,
                 [line for line, _ in first_rank_hits(hits)][:3], fix,
                 step=int(at_step["step"]) if at_step else None, details=details)


# --------------------------------------------------------------------------------- DataLoader worker
_LOADER = re.compile(r"DataLoader worker \(pid(?:\(s\))? (?P<pids>[\d, ]+)\) (?:is killed by signal: (?P<sig>[^.]+)\.|"
                     r"exited unexpectedly)|Unexpected bus error encountered in worker|"
                     r"Unexpected segmentation fault encountered in worker|"
                     r"dataloader's workers are out of shared memory")
_SHM = re.compile(r"bus error|shared memory|\bshm\b", re.IGNORECASE)


def dataloader_worker(lines: Sequence[LogLine]) -> Match | None:
    hits = find_all(lines, _LOADER)
    if not hits:
        return None
    anchor = hits[0][0]
    mine = first_rank_hits(hits)
    text = " ".join(line.text for line, _ in mine)
    signal_name = next((m["sig"].strip() for _, m in mine if m["sig"]), None)
    if _SHM.search(text):
        kind = "shm"
        fix = ("The DataLoader workers hand batches over through shared memory (/dev/shm), and it ran out (a "
               "container's default is 64 MB). Give it more (docker run --shm-size=8g, or --ipc=host; on "
               "Kubernetes an emptyDir with medium: Memory at /dev/shm), or lower data.num_workers / "
               "data.batch_size.")
    elif signal_name == "Killed":
        kind = "killed"
        fix = ("A loader worker was SIGKILLed: usually the host's out-of-memory killer (`dmesg -T | grep -i "
               "'killed process'`). Lower data.num_workers, and avoid holding the whole data set in memory in "
               "every worker.")
    else:
        kind = "crashed"
        fix = ("A loader worker died without saying why. Run with data.num_workers=0 to see the real error in the "
               "main process (the dataset's __getitem__ or a transform).")
    pids = next((m["pids"].strip() for _, m in mine if m["pids"]), None)
    return Match("dataloader_worker", f"a DataLoader worker of rank {anchor.rank} died"
                 + (f" ({signal_name})" if signal_name else ""), anchor.rank,
                 [line for line, _ in mine][:3], fix, details={"kind": kind, "signal": signal_name, "pids": pids,
                                                              "ranks": hit_ranks(hits)})


# ------------------------------------------------------------------------------------ killed by signal
_EXITCODE = re.compile(r"exit ?code:? (?P<code>-\d+)|Signal (?P<num>\d+) \((?P<name>SIG\w+)\) received by PID")
_FATAL = re.compile(r"Fatal Python error: (?P<what>Segmentation fault|Aborted|Bus error|Floating point exception)")
_FATAL_SIG = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
              "Floating point exception": "SIGFPE"}
_TEARDOWN = {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1"}


def signal_fix(name: str | None) -> str:
    """What a death by ``name`` usually means, and what to do."""
    if name in (None, "SIGKILL"):
        return ("Nothing in a training job sends SIGKILL by itself: it is usually the host's out-of-memory killer "
                "(`dmesg -T | grep -i -E 'out of memory|killed process'` shows it), a scheduler enforcing a memory "
                "or time limit (SLURM, Kubernetes), or a kill -9. Lower host memory per rank (fewer "
                "data.num_workers, no full copy of the data set in every process), then continue with "
                "--resume auto.")
    if name == "SIGBUS":
        return ("SIGBUS usually means shared memory (/dev/shm) ran out: give the container more (--shm-size=8g or "
                "--ipc=host) or lower data.num_workers.")
    if name in _TEARDOWN:
        return ("The rank was stopped from outside (a scheduler's time limit or preemption, Ctrl-C, a kill). "
                "Continue with --resume auto.")
    return (f"{name} is a crash in native code (CUDA, NCCL, the driver, or a compiled extension). Rerun with "
            "PYTHONFAULTHANDLER=1 for the Python stack of the crash, and check that torch, CUDA and the driver "
            "match (mgpu doctor).")


def killed_by_signal(lines: Sequence[LogLine]) -> Match | None:
    hits = [(line, m) for line, m in scan(lines, (_EXITCODE, _FATAL)) if m.re is _FATAL or _signal_name(m)]
    if not hits:
        return None
    anchor, found = hits[0]
    name = _FATAL_SIG[found["what"]] if found.re is _FATAL else _signal_name(found)
    note = " (probably the host's out-of-memory killer)" if name == "SIGKILL" else ""
    evidence, fix = [anchor], signal_fix(name)
    terminate = find_all([line for line in lines if line.rank == anchor.rank], _TERMINATE) if name == "SIGABRT" else []
    if terminate:
        evidence.insert(0, terminate[0][0])
        fix += _TERMINATE_FIX
    return Match("killed_by_signal", f"rank {anchor.rank} was killed by {name}{note}", anchor.rank, evidence,
                 fix, cause=name not in _TEARDOWN, details={"signal": name})


# C++'s std::terminate, as a rank aborts when it tears the process group down while another rank still uses it.
_TERMINATE = re.compile(r"terminate called without an active exception")
_TERMINATE_FIX = (" If it happened as the job ended (at or after destroy_process_group), one rank tore the process "
                  "group down while another still used it: call dist.barrier() before dist.destroy_process_group().")


def _signal_name(found: re.Match[str]) -> str | None:
    if found["name"]:
        return found["name"]
    code = int(found["code"])
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


# -------------------------------------------------------------------------------------- port in use
_ADDR = re.compile(r"EADDRINUSE|Address already in use|address already in use|errno: 98\b")
_PORT = re.compile(r"port: (?P<a>\d+)|:(?P<b>\d+) \(errno: 98|failed to bind to \S*:(?P<c>\d+)|port (?P<d>\d+)")


def address_in_use(lines: Sequence[LogLine]) -> Match | None:
    hits = find_all(lines, _ADDR)
    if not hits:
        return None
    anchor = hits[0][0]
    port_match = _PORT.search(anchor.text)
    port = next((int(v) for v in port_match.groups() if v), None) if port_match else None
    which = f"port {port}" if port else "its port"
    fix = (f"Another process was already listening on {which} (often an earlier job, or one of its workers, still "
           f"running: `ss -ltnp | grep :{port or 'PORT'}` names it). Stop it, or pick another port; on one node leave "
           "--master-port out and mgpu uses a private rendezvous on a free port. If the port was one torch picked "
           "for the workers itself, another program took it in the moment before rank 0 bound it: run again.")
    return Match("address_in_use", f"rank {anchor.rank} could not listen on {which}: address already in use",
                 anchor.rank, [anchor], fix, details={"port": port, "ranks": hit_ranks(hits)})


# -------------------------------------------------------------------------------------- disk full
# mgpu's own message, the OS's, and torch's zip writer's (which reports a full disk as a RuntimeError).
_DISK = re.compile(r"could not write checkpoint (?P<path>\S+?): (?:not written: )?the disk is (?:too )?full|"
                   r"No space left on device|Disk quota exceeded|errno: 28\b|unexpected pos \d+ vs \d+|"
                   r"PytorchStreamWriter failed writing file|Read-only file system")


def disk_full(lines: Sequence[LogLine]) -> Match | None:
    hits = find_all(lines, _DISK)
    if not hits:
        return None
    anchor, found = hits[0]
    read_only = "Read-only" in anchor.text
    what = "the disk is read-only" if read_only else "the disk is full"
    path = found["path"]
    fix = ("Point run_dir (and --log-dir) at a writable disk." if read_only else
           "Free space on that disk (old numbered checkpoints, other runs) or point run_dir at a larger disk, then "
           "continue with --resume auto: the previous checkpoint is kept (writes are atomic).")
    where = f" writing {path}" if path else ""
    return Match("disk_full", f"rank {anchor.rank}: {what}{where}", anchor.rank, [anchor], fix,
                 details={"path": path, "read_only": read_only, "ranks": hit_ranks(hits)})
