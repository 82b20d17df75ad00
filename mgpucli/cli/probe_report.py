"""The fit probe's report (engine/probe.py) for people (lines on stderr) or programs (one JSON object on stdout).

Plain text, no rich: it is printed by a worker's rank 0 as well as by ``mgpu train`` on a terminal.
"""

from __future__ import annotations

import json
import sys
from typing import Any

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def size(n: float | None) -> str:
    if n is None:
        return "?"
    unit = 0
    while n >= 1024 and unit < len(_UNITS) - 1:
        n, unit = n / 1024, unit + 1
    return f"{n:.0f} {_UNITS[unit]}" if unit < 2 else f"{n:.1f} {_UNITS[unit]}"


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def memory(rank: dict[str, Any]) -> str:
    cuda = rank.get("cuda")
    if cuda:
        share = cuda["max_reserved_bytes"] / cuda["total_bytes"] if cuda["total_bytes"] else 0.0
        return (f"GPU {size(cuda['max_allocated_bytes'])} allocated, {size(cuda['max_reserved_bytes'])} reserved of "
                f"{size(cuda['total_bytes'])} ({share:.0%}); host RSS {size(rank['peak_rss_bytes'])}")
    total = rank.get("host_total_bytes")
    share = f" ({rank['peak_rss_bytes'] / total:.1%})" if total else ""
    return f"peak RSS {size(rank['peak_rss_bytes'])} of {size(total)}{share}"


def lines(report: dict[str, Any]) -> list[str]:
    r = report
    out = [f"fit probe: {r['recipe']} on {r['world_size']} process(es), {r['device']}, strategy {r['strategy']}, "
           f"precision {r['precision']}; global batch {r['global_batch']} = {r['batch_size']} per process x "
           f"{r['world_size']} x {r['grad_accum']}; {r['warmup_steps']} warm-up + {r['measured_steps']} timed "
           "optimizer steps"]
    rows = [("rank", "device", "step time", "samples/s", "peak memory")]
    rows += [(str(k["rank"]), k["device"], duration(k["step_time_s"]), f"{k['samples_per_s']:.0f}", memory(k))
             for k in r["ranks"]]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    out += ["  ".join([*(c.rjust(w) if i in (0, 2, 3) else c.ljust(w) for i, (c, w) in
                         enumerate(zip(row[:4], widths, strict=True))), row[4]]) for row in rows]
    for name, host in r.get("hosts", {}).items():
        total = host["total_bytes"]
        share = f" ({host['peak_rss_sum_bytes'] / total:.1%})" if total else ""
        out.append(f"host {name}: its {host['ranks']} rank(s) peaked at {size(host['peak_rss_sum_bytes'])} resident "
                   f"together, of {size(total)}{share}")
    out.append(f"job: {duration(r['step_time_s'])} per step, {r['samples_per_s']:.0f} samples/s; an epoch "
               f"({r['steps_per_epoch']} steps) ~ {duration(r['epoch_time_s'])}, the run ({r['total_steps']} steps) "
               f"~ {duration(r['run_time_s'])} (training steps only: validation and checkpoints come on top)")
    out.append("it fits: every rank ran its steps." if r["fits"] else
               "it ran, but a GPU's allocator reserved more than 95% of its memory: little headroom (see knobs: "
               "data.batch_size with trainer.grad_accum, trainer.precision=bf16, trainer.activation_checkpointing, "
               "trainer.strategy=fsdp).")
    out.append("Nothing was written: no checkpoint, no run dir.")
    return out


def render(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report), flush=True)
        return
    for line in lines(report):
        print(line, file=sys.stderr, flush=True)
