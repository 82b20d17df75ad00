"""One process of the live test, started by torch's launcher (``python -m torch.distributed.run ... -m
mgpucli.doctor.live_worker``): checks three collectives give the right values, then times all_reduce.

Each rank writes ``rank<R>.json`` in ``--out`` after every phase (atomically), so that if the test hangs the
doctor still knows where each rank got to.

Test-only fault hooks (``mgpucli.faults``, inert unless ``MGPU_FAULT`` is set): the live test counts as
training step 0, so ``MGPU_FAULT=sleep@rank=1`` makes rank 1 hang in all_reduce, ``crash@rank=1`` makes it
raise there, ``nan@rank=1`` makes it contribute NaN (wrong values).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from mgpucli import faults
from mgpucli.distributed.collectives import barrier
from mgpucli.distributed.env import read_rank_env
from mgpucli.distributed.runtime import Runtime, setup_process_group, teardown
from mgpucli.run_records.json_files import write_json

ELEMENTS = 4096  # small, exact in float32


class Recorder:
    """This rank's report, rewritten after every phase."""

    def __init__(self, out_dir: str, rank: int):
        self.path = os.path.join(out_dir, f"rank{rank}.json")
        self.data: dict[str, Any] = {"rank": rank, "phase": "start", "collectives": {}, "bandwidth": []}

    def save(self, **updates: Any) -> None:
        self.data.update(updates)
        write_json(self.path, self.data)


def _compare(name: str, got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    got = got.detach().cpu()
    if torch.equal(got, want):
        return {"ok": True}
    bad = (got != want).nonzero()
    first = int(bad[0, 0]) if len(bad) else 0
    return {
        "ok": False,
        "detail": f"{name}: {len(bad)} of {want.numel()} values wrong (element {first}: expected "
        f"{want[first].item():g}, got {got[first].item():g})",
    }


def check_all_reduce(rt: Runtime) -> dict[str, Any]:
    n, r = rt.world_size, rt.rank
    base = torch.arange(ELEMENTS, dtype=torch.float32)
    mine = base + 1000.0 * (r + 1)
    if faults.maybe_fault("step", rank=r, step=0):  # nan: a corrupt contribution
        mine[0] = float("nan")
    t = mine.to(rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return _compare("all_reduce", t, base * n + 1000.0 * n * (n + 1) / 2)


def check_broadcast(rt: Runtime) -> dict[str, Any]:
    src = rt.world_size - 1  # a non-zero source where there is one: catches rank mix-ups
    want = torch.arange(ELEMENTS, dtype=torch.float32) * 3 + 7
    t = (want if rt.rank == src else torch.zeros(ELEMENTS)).to(rt.device)
    dist.broadcast(t, src=src)
    return _compare("broadcast", t, want)


def check_all_gather(rt: Runtime) -> dict[str, Any]:
    base = torch.arange(ELEMENTS, dtype=torch.float32)
    outs = [torch.empty(ELEMENTS, device=rt.device) for _ in range(rt.world_size)]
    dist.all_gather(outs, (base + ELEMENTS * rt.rank).to(rt.device))
    return _compare("all_gather", torch.cat(outs), torch.cat([base + ELEMENTS * j for j in range(rt.world_size)]))


def _sync(rt: Runtime) -> None:
    if rt.device.type == "cuda":
        torch.cuda.synchronize(rt.device)


def measure_bandwidth(rt: Runtime, sizes: list[int], iters: int, warmup: int = 2) -> list[dict[str, float]]:
    """Seconds per all_reduce at each size, on this rank (the doctor takes the slowest rank)."""
    rows = []
    for nbytes in sizes:
        t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=rt.device)
        for _ in range(warmup):
            dist.all_reduce(t)
        _sync(rt)
        barrier(rt)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        _sync(rt)
        rows.append({"bytes": t.numel() * 4, "seconds": (time.perf_counter() - start) / iters})
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mgpucli.doctor.live_worker")
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--sizes", default="65536,1048576,8388608", help="all_reduce sizes in bytes")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--timeout", type=int, default=30, help="process-group timeout, seconds")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads on CPU")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = read_rank_env()
    rec = Recorder(args.out, env.rank)
    try:
        rec.save(phase="init", world_size=env.world_size)
        rt = setup_process_group(env, args.device, args.timeout, args.threads)
        rec.save(backend=rt.backend, device=str(rt.device))
        if not rt.distributed:  # one process: a group of one still tests init and the collectives
            dist.init_process_group(
                "nccl" if rt.device.type == "cuda" else "gloo", rank=0, world_size=1, store=dist.HashStore()
            )
            rt.backend = dist.get_backend()
        for name, check in (
            ("all_reduce", check_all_reduce),
            ("broadcast", check_broadcast),
            ("all_gather", check_all_gather),
        ):
            rec.save(phase=name)
            rec.data["collectives"][name] = check(rt)
            rec.save()
        rec.save(phase="bandwidth")
        sizes = [int(s) for s in args.sizes.split(",") if s]
        rec.save(bandwidth=measure_bandwidth(rt, sizes, args.iters), phase="done")
        return 0
    except Exception as exc:
        rec.save(error=f"{type(exc).__name__}: {exc}".strip())
        traceback.print_exc()
        return 1
    finally:
        teardown()


if __name__ == "__main__":
    sys.exit(main())
