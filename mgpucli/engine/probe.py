"""The fit probe (``mgpu train --probe``): will this recipe fit on these devices, and how fast will it go? Measured.

Every rank builds everything for real, as training would (data, model, strategy, optimizer, EMA, activation
checkpointing, precision), takes a few warm-up steps (allocations, DDP's bucket rebuild, cuDNN's autotuning, the
optimizer's state), then times ``steps`` real optimizer steps. Each rank measures its peak memory (CUDA: the
caching allocator's peak allocated and reserved bytes against the device's total; every device: the process's
peak resident memory against the host's), its step time and throughput; rank 0 gathers them (one collective, at
the end) and estimates an epoch and the run. Nothing is written: the trainer neither takes the run dir nor saves.

A CUDA out-of-memory error is reported with the phase it happened in (setup, forward, backward, optimizer step)
and the knobs that lower memory, in the order to try them.
"""

from __future__ import annotations

import math
import os
import re
import resource
import socket
import time
from collections.abc import Iterator
from typing import Any

import torch

from mgpucli.distributed import collectives
from mgpucli.errors import JobFailed
from mgpucli.run_records import step_anatomy

WARMUP_STEPS = 3
GIB = 1024**3


def measure(trainer, steps: int, warmup: int = WARMUP_STEPS) -> dict[str, Any]:
    """Warm up, then time ``steps`` optimizer steps on this rank; returns this rank's figures (every rank calls it,
    in step with the others)."""
    runtime = trainer.runtime
    trainer.trained.model.train.train()
    batches = _endless(trainer)
    for _ in range(warmup):
        next(batches)
    _sync(runtime.device)
    collectives.barrier(runtime)  # every rank starts its clock together
    clock = trainer.clock
    if clock is not None:
        clock.take()  # the warm-up's seconds are not the measured steps'
    start = time.perf_counter()
    for _ in range(steps):
        next(batches)
    _sync(runtime.device)
    elapsed = time.perf_counter() - start
    anatomy = step_anatomy.figures(clock.take(), elapsed, steps) if clock is not None else None
    trainer.intervals.read_reduction()  # finish the metrics all-reduce still in flight (every rank has one)
    per_step = elapsed / steps
    samples = trainer.cfg.data.batch_size * trainer.settings.grad_accum  # this rank's, per optimizer step
    return {"rank": runtime.rank, "host": socket.gethostname(), "device": str(runtime.device),
            "step_time_s": per_step, "samples_per_s": samples / per_step if per_step > 0 else 0.0,
            "anatomy": anatomy, **_memory(runtime.device)}


def _endless(trainer) -> Iterator[None]:
    """One optimizer step per ``next``, epoch after epoch of the train loader (the probe may outlast one)."""
    epoch = 0
    while True:
        trainer.loaders.sampler.set_epoch(epoch)
        batches = iter(trainer.loaders.train)
        stepped = False
        while trainer.train_step(batches):
            stepped = True
            yield
        if not stepped:
            raise JobFailed("the train loader gave no batch: nothing to measure.")
        epoch += 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _memory(device: torch.device) -> dict[str, Any]:
    """Peak memory: this process's resident set (Linux reports KiB), and on CUDA the allocator's peaks."""
    out: dict[str, Any] = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                           "host_total_bytes": _host_total(), "cuda": None}
    if device.type == "cuda":
        out["cuda"] = {"max_allocated_bytes": torch.cuda.max_memory_allocated(device),
                       "max_reserved_bytes": torch.cuda.max_memory_reserved(device),
                       "total_bytes": torch.cuda.get_device_properties(device).total_memory}
    return out


def report(ranks: list[dict[str, Any]], trainer, steps: int, warmup: int) -> dict[str, Any]:
    """Rank 0's summary of every rank's figures: the slowest rank sets the pace of a synchronous job."""
    cfg, runtime = trainer.cfg, trainer.runtime
    step_time = max(r["step_time_s"] for r in ranks)
    global_batch = cfg.data.batch_size * runtime.world_size * trainer.settings.grad_accum
    steps_per_epoch = math.ceil(len(trainer.loaders.train) / trainer.settings.grad_accum)
    total_steps = trainer.total_steps
    return {
        "recipe": cfg.name, "world_size": runtime.world_size, "device": str(runtime.device),
        "strategy": trainer.trained.model.strategy, "precision": cfg.trainer.precision,
        "batch_size": cfg.data.batch_size, "grad_accum": trainer.settings.grad_accum, "global_batch": global_batch,
        "warmup_steps": warmup, "measured_steps": steps,
        "step_time_s": step_time, "samples_per_s": global_batch / step_time if step_time > 0 else 0.0,
        "steps_per_epoch": steps_per_epoch, "epoch_time_s": steps_per_epoch * step_time,
        "total_steps": total_steps, "run_time_s": total_steps * step_time,
        "fits": all(_fits(r) for r in ranks),
        "hosts": _hosts(ranks),
        "ranks": ranks,
    }


def _hosts(ranks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per machine: its ranks' peak resident memory added up, against its memory (what the host must hold)."""
    hosts: dict[str, dict[str, Any]] = {}
    for r in ranks:
        host = hosts.setdefault(r["host"], {"ranks": 0, "peak_rss_sum_bytes": 0, "total_bytes": r["host_total_bytes"]})
        host["ranks"] += 1
        host["peak_rss_sum_bytes"] += r["peak_rss_bytes"]
    return hosts


def _fits(rank: dict[str, Any]) -> bool:
    """It ran; on CUDA with some headroom (the allocator's reserve below 95% of the device)."""
    cuda = rank.get("cuda")
    return cuda is None or cuda["max_reserved_bytes"] < 0.95 * cuda["total_bytes"]


# ------------------------------------------------------------------------------------------ out of memory
def phase_of(heartbeat_phase: str | None, stepping: bool) -> str:
    """The phase a CUDA OOM happened in, from what the rank's heartbeat said it was doing."""
    if not stepping:
        return "setup"
    phase = heartbeat_phase or ""
    for name in ("forward", "backward", "optimizer"):
        if phase.startswith(name):
            return "optimizer step" if name == "optimizer" else name
    return phase or "step"


_WHY = {
    "setup": "the model and its state did not fit on the device before the first step",
    "forward": "the activations of a forward pass did not fit",
    "backward": "the gradients and the activations backward needs did not fit",
    "optimizer step": "the optimizer's state (AdamW: two more copies of the parameters) did not fit",
}


def knobs(cfg) -> list[str]:
    """What lowers memory, in the order to try it; the knobs the recipe already uses are left out."""
    trainer, batch, accum = cfg.trainer, int(cfg.data.batch_size), int(cfg.trainer.grad_accum)
    found = []
    if batch > 1:
        found.append(f"data.batch_size={batch // 2} trainer.grad_accum={accum * 2} (the same global batch, half the "
                     "activations)")
    if trainer.precision == "fp32":
        found.append("trainer.precision=bf16 (half the activation memory)")
    if not trainer.activation_checkpointing and not trainer.fsdp.activation_checkpointing:
        found.append("trainer.activation_checkpointing=true (recompute the blocks' activations in backward)")
    if trainer.strategy != "fsdp":
        found.append("trainer.strategy=fsdp (shard parameters, gradients and optimizer state across the GPUs)")
    elif not trainer.fsdp.cpu_offload:
        found.append("trainer.fsdp.cpu_offload=true (keep parameters and optimizer state in CPU memory)")
    return found


def out_of_memory(err: BaseException, phase: str, step: int, warmup: int, cfg, rank: int,
                  device: torch.device) -> JobFailed:
    stage = f"warm-up step {step}" if step <= warmup else f"measured step {step - warmup}"
    where = "during setup" if phase == "setup" else f"in the {phase} of {stage}"
    asked = re.search(r"Tried to allocate [0-9.]+ [KMGT]?i?B", str(err))
    peak = ""
    if device.type == "cuda" and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(device).total_memory
        peak = (f" (peak {torch.cuda.max_memory_allocated(device) / GIB:.1f} GiB allocated, "
                f"{torch.cuda.max_memory_reserved(device) / GIB:.1f} GiB reserved of {total / GIB:.1f} GiB)")
    steps = knobs(cfg)
    hint = ("Try, in this order (each on its own, then together):\n" +
            "\n".join(f"  {i}. {k}" for i, k in enumerate(steps, 1))) if steps else \
        "The recipe already uses every knob mgpu has: a smaller model, or GPUs with more memory."
    tried = f" ({asked.group(0).lower()})" if asked else ""
    return JobFailed(f"rank {rank}: it does not fit: out of GPU memory {where}{tried}{peak}: "
                     f"{_WHY.get(phase, phase)}.", hint, retryable=False)
