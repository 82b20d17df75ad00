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
    if r.get("scaling"):
        out += scaling_lines(r)
    out.append("Nothing was written: no checkpoint, no run dir.")
    return out


PHASES = ("data", "compute", "comm", "optimizer", "other")


def add_scaling(report: dict[str, Any], single: dict[str, Any]) -> None:
    """Put the 1-process probe beside the N-process one: throughput, efficiency (N-process samples/s over N times
    the 1-process samples/s) and, per phase, the seconds per step each added (the anatomy that explains the loss)."""
    n = report["world_size"]
    one = single["samples_per_s"]
    report["scaling"] = {
        "processes": n, "one_process": {key: single[key] for key in ("step_time_s", "samples_per_s", "global_batch")}
        | {"anatomy": single["ranks"][0].get("anatomy")},
        "samples_per_s": report["samples_per_s"], "speedup": report["samples_per_s"] / one if one else None,
        "efficiency": report["samples_per_s"] / (n * one) if one else None,
        "added_s_per_step": _added(single, report),
    }


def _seconds(rank: dict[str, Any]) -> dict[str, float] | None:
    anatomy = rank.get("anatomy")
    if not anatomy:
        return None
    return {p: anatomy[p] * anatomy["step_s"] for p in PHASES}


def _added(single: dict[str, Any], report: dict[str, Any]) -> dict[str, float] | None:
    """Per phase: the N-process ranks' mean seconds per step minus the 1-process run's."""
    base = _seconds(single["ranks"][0])
    ranks = [_seconds(k) for k in report["ranks"]]
    if base is None or not ranks or any(k is None for k in ranks):
        return None
    return {p: sum(k[p] for k in ranks) / len(ranks) - base[p] for p in PHASES}


def scaling_lines(r: dict[str, Any]) -> list[str]:
    s = r["scaling"]
    one, n = s["one_process"], s["processes"]
    out = [f"scaling: the same {r['measured_steps']} timed steps on 1 process and on {n}, "
           f"{r['batch_size']} samples per process per micro-batch"]
    rows = [("processes", "step time", "samples/s", "speedup", "efficiency", *PHASES)]
    rows.append(("1", duration(one["step_time_s"]), f"{one['samples_per_s']:.0f}", "1.00x", "100%",
                 *_shares(one.get("anatomy"))))
    for k in r["ranks"]:
        rows.append((f"{n} (rank {k['rank']})", duration(k["step_time_s"]), "", "", "", *_shares(k.get("anatomy"))))
    rows.append((f"{n} (job)", duration(r["step_time_s"]), f"{s['samples_per_s']:.0f}", f"{s['speedup']:.2f}x",
                 f"{s['efficiency']:.0%}", *[""] * len(PHASES)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                               strict=True)))
            for row in rows]
    added = s.get("added_s_per_step")
    if added:
        grew = sorted(((v, p) for p, v in added.items() if v > 0), reverse=True)
        if grew:
            out.append(f"where the {n}-process step's extra time goes (per step, the ranks' mean beyond 1 process): "
                       + ", ".join(f"{p} +{duration(v)}" for v, p in grew[:3]))
    return out


def _shares(anatomy: dict[str, Any] | None) -> list[str]:
    return [f"{anatomy[p]:.0%}" for p in PHASES] if anatomy else ["?"] * len(PHASES)


def render(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report), flush=True)
        return
    for line in lines(report):
        print(line, file=sys.stderr, flush=True)
