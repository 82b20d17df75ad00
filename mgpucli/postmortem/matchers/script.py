"""Failures particular to users' own scripts (``mgpu launch SCRIPT.py``): a script written for the legacy
``python -m torch.distributed.launch`` (its ``--local_rank`` argument), a script that spawns its own distributed
processes inside the launched ranks, and GPU code (the nccl backend, CUDA calls)
where no GPU is visible, as on ``--cpu`` workers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mgpucli.postmortem.lines import LogLine, by_rank, find_all
from mgpucli.postmortem.matchers.base import Match, hit_ranks
from mgpucli.postmortem.tracebacks import last_exception
from mgpucli.run_records.nested_launch import ERROR_NAME, FIX

# --------------------------------------------------------------------------------- the legacy --local_rank
_FLAG = re.compile(r"--local[-_]rank")
_REQUIRED = re.compile(r"error: the following arguments are required: .*?(?P<flag>--local[-_]rank)\b")
_UNRECOGNIZED = re.compile(r"error: unrecognized arguments: .*?(?P<flag>--local[-_]rank)(?:=(?P<value>-?\d+))?")
_USAGE = re.compile(r"^\s*usage: ")
_BAD_DEVICE = re.compile(r"Invalid device string: '(?:cuda|xpu|npu):(?:None|-1)'|Device index must not be negative|"
                         r"Expected a torch\.device with a specified index or an integer, but got:\s*None|"
                         r"Invalid device ordinal|device >= 0 && device < num_gpus")
_ARG_USE = re.compile(r"\b\w+\.local_rank\b")  # args.local_rank: the argparse namespace's attribute
_LEGACY = "python -m torch.distributed.launch"
_FROM_ENV = "default=int(os.environ.get('LOCAL_RANK', -1))"


def _declared(lines: Sequence[LogLine], anchor: LogLine) -> str | None:
    """The spelling argparse's usage lines (printed just before its error, same rank) show, if any."""
    mine = [line for line in lines if line.rank == anchor.rank]
    at = next((i for i, line in enumerate(mine) if line is anchor), len(mine))
    start = next((i for i in range(at - 1, -1, -1) if _USAGE.match(mine[i].text)), None)
    if start is None:
        return None
    found = _FLAG.search(" ".join(line.text for line in mine[start:at]))
    return found.group(0) if found else None


def legacy_local_rank(lines: Sequence[LogLine]) -> Match | None:
    """A script that expects ``--local_rank`` on its command line, launched without it (argparse: "the following
    arguments are required"; a default of -1 or None used as a device), or given the other spelling ("unrecognized
    arguments: --local-rank=0", what torch.distributed.launch passes a script declaring ``--local_rank``)."""
    hits = find_all(lines, _REQUIRED)
    if hits:
        anchor, found = hits[0]
        flag = found["flag"]
        return Match(
            "legacy_local_rank", f"the script requires {flag}, and nothing passed it", anchor.rank,
            [anchor], f"The script was written for {_LEGACY}, which passed {flag}=N; torchrun and mgpu give the "
            f"rank in the environment (LOCAL_RANK) instead. Launch it with mgpu launch --local-rank-arg: every worker "
            f"then gets {flag}=N, the spelling the script declares. (Or make the script read the environment: "
            f"{_FROM_ENV}.)", details={"kind": "missing", "flag": flag, "ranks": hit_ranks(hits)})
    hits = find_all(lines, _UNRECOGNIZED)
    if hits:
        anchor, found = hits[0]
        given, wanted = found["flag"], _declared(lines, anchor)
        details: dict[str, Any] = {"kind": "unrecognized", "given": given, "wants": wanted, "ranks": hit_ranks(hits)}
        if wanted is not None and wanted != given:
            title = f"the script declares {wanted}, but was given {given}"
            fix = (f"The script declares {wanted}, and was given {given}=N ({given} is the spelling {_LEGACY} passes "
                   f"since torch 2.0). mgpu launch --local-rank-arg passes the spelling the script declares "
                   f"({wanted}=N); or let the script take both: parser.add_argument('--local-rank', '--local_rank', "
                   "dest='local_rank', type=int).")
        else:
            title = f"the script does not take {given}"
            fix = (f"The script declares no {given} option: it reads its rank from the environment (LOCAL_RANK), "
                   "as torchrun-style scripts do. Launch it without --local-rank-arg.")
        return Match("legacy_local_rank", title, anchor.rank, [anchor], fix, details=details)
    return _local_rank_default(lines)


def _local_rank_default(lines: Sequence[LogLine]) -> Match | None:
    """``args.local_rank`` left at its default (-1 or None) where a device index was expected: the script's
    legacy --local_rank argument was never given."""
    for rank, own in by_rank(lines).items():
        tb = last_exception(own)
        if tb is None or tb.exc_line is None:
            continue
        frame = tb.user_frame()
        if frame is None or frame.code is None or "/mgpucli/" in frame.file:
            continue
        said = f"{tb.exc_type}: {tb.message}"
        if not _ARG_USE.search(frame.code.text) or not (_BAD_DEVICE.search(said) or re.search(r"\bNone\b|-1\b", said)):
            continue
        evidence = [frame.where, frame.code, tb.exc_line]
        return Match(
            "legacy_local_rank", "the script's local_rank kept its default (-1 or None): nothing passed --local_rank",
            rank, evidence, f"The script takes its local rank from a --local_rank argument, as scripts for {_LEGACY} "
            "did; torchrun and mgpu give it in the environment (LOCAL_RANK) instead, so it kept its default. Launch "
            f"it with mgpu launch --local-rank-arg, or set the argument's default from the environment: {_FROM_ENV}.",
            details={"kind": "default", "exception": tb.exc_type, "message": tb.message})
    return None


# ------------------------------------------------------------------------------ nccl on CPU workers
_NCCL_NO_GPU = re.compile(r"ProcessGroupNCCL is only supported with GPUs, no GPUs found|"
                          r"Distributed package doesn't have NCCL built in|"
                          r"NCCL (?:error|Error).*(?:no CUDA-capable device|CUDA driver version is insufficient)")


def nccl_without_gpus(lines: Sequence[LogLine]) -> Match | None:
    """The nccl backend asked for where the process sees no GPU (``--cpu`` hides them) or torch has no NCCL."""
    hits = find_all(lines, _NCCL_NO_GPU)
    if not hits:
        return None
    anchor = hits[0][0]
    return Match("nccl_without_gpus", f"rank {anchor.rank} asked for the nccl backend, which needs GPUs it does "
                 "not have", anchor.rank, [anchor],
                 "nccl runs on NVIDIA GPUs only. On CPUs use gloo: dist.init_process_group('gloo'), or let torch pick "
                 "per device: dist.init_process_group(backend='cuda:nccl,cpu:gloo') (with no backend at all it does "
                 "the same); on GPUs, launch with --gpus N and a CUDA build of torch.",
                 details={"ranks": hit_ranks(hits)})


# ------------------------------------------------------------------------------ CUDA calls without a GPU
_CUDA_NO_GPU = re.compile(r"No CUDA GPUs are available|Torch not compiled with CUDA enabled|"
                          r"Found no NVIDIA driver on your system|no CUDA-capable device is detected|"
                          r"CUDA driver initialization failed|module 'torch\._C' has no attribute '_cuda_\w+'")


def cuda_without_gpus(lines: Sequence[LogLine]) -> Match | None:
    """CUDA used (``set_device``, ``.cuda()``, ``device="cuda"``) where the process sees no GPU, or torch is a CPU
    build."""
    hits = find_all(lines, _CUDA_NO_GPU)
    if not hits:
        return None
    anchor = hits[0][0]
    return Match("cuda_without_gpus", f"rank {anchor.rank} used CUDA, and it sees no GPU", anchor.rank, [anchor],
                 "The code calls CUDA (torch.cuda.set_device, .cuda(), device='cuda') where no GPU is visible or torch "
                 "is a CPU build. On a GPU machine, check nvidia-smi, CUDA_VISIBLE_DEVICES and that torch is a CUDA "
                 "build (mgpu doctor); to run on CPUs too, pick the device in the script: "
                 "torch.device('cuda', local_rank) if torch.cuda.is_available() else torch.device('cpu'), with gloo.",
                 details={"ranks": hit_ranks(hits)})


# ------------------------------------------------------------------------------ a script that is its own launcher
_NESTED = re.compile(rf"\b{ERROR_NAME}: .*?\((?P<what>[^)]*)\)")


def nested_launcher(lines: Sequence[LogLine]) -> Match | None:
    """The script spawned distributed processes of its own inside a launched rank (mgpucli.launch.nested)."""
    hits = find_all(lines, _NESTED)
    if not hits:
        return None
    anchor, found = hits[0]
    return Match("nested_launcher", f"the script starts its own distributed processes ({found['what']}) inside "
                 "the ranks mgpu launch started", anchor.rank, [anchor], FIX,
                 details={"ranks": hit_ranks(hits), "what": found["what"]})
