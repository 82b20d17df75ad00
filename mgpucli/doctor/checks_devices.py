"""Device checks: which GPUs, how much memory, already busy, mixed models, compute mode, the selection."""

from __future__ import annotations

from mgpucli.doctor.observation import Observation, SmiGpu
from mgpucli.doctor.result import CheckResult, fail, ok, skipped, warn

AREA = "devices"
BUSY_MEMORY_FRACTION = 0.10  # an idle GPU holds a few hundred MiB at most (display, persistence)
BUSY_UTILIZATION_PCT = 20


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def selected_smi_gpus(obs: Observation) -> tuple[SmiGpu, ...]:
    """nvidia-smi's entries for the GPUs the plan uses (matched by UUID); all of them when unsure."""
    by_uuid = {g.uuid.lower().removeprefix("gpu-"): g for g in obs.smi.gpus}
    if obs.plan.kind != "cuda":
        return obs.smi.gpus
    devices = [obs.torch.devices[i] for i in obs.plan.gpu_indices if i < obs.torch.device_count]
    picked = [by_uuid.get(d.uuid) for d in devices]
    if not picked or any(g is None for g in picked):
        return obs.smi.gpus
    return tuple(g for g in picked if g is not None)


def check_selection(obs: Observation) -> CheckResult:
    """What the doctor checks for; fails when the requested GPUs cannot be used here."""
    p = obs.plan
    if p.kind is None:
        return fail("device selection", AREA, p.error, p.hint or "Pick devices this machine has (see 'GPUs').")
    where = f" on GPUs {','.join(map(str, p.gpu_indices))}" if p.kind == "cuda" else ""
    note = f"; {p.note}" if p.note else ""
    return ok("device selection", AREA, f"{p.describe()}{where}{note}")


def check_gpus(obs: Observation) -> CheckResult:
    t, smi = obs.torch, obs.smi
    if t.device_count:
        names = ", ".join(f"{i}: {d.name} ({_gib(d.total_memory)})" for i, d in enumerate(t.devices))
        hidden = len(smi.gpus) - t.device_count
        extra = f"; {hidden} more on the machine, hidden by CUDA_VISIBLE_DEVICES" if hidden > 0 else ""
        return ok("GPUs", AREA, f"{t.device_count} visible to torch: {names}{extra}")
    if smi.gpus:
        if "CUDA_VISIBLE_DEVICES" in obs.env:
            why = f"CUDA_VISIBLE_DEVICES={obs.env['CUDA_VISIBLE_DEVICES']!r} hides them"
            hint = "unset CUDA_VISIBLE_DEVICES (or fix it, see the CUDA_VISIBLE_DEVICES check)"
        else:
            why = "see 'CUDA driver' and 'torch CUDA build'"
            hint = "Fix the driver / torch build first (their hints above)."
        status = warn if obs.plan.kind == "cpu" else fail
        return status("GPUs", AREA, f"nvidia-smi lists {len(smi.gpus)} GPU(s), torch sees none: {why}", hint)
    return skipped("GPUs", AREA, "no NVIDIA GPU on this machine")


def check_gpu_memory(obs: Observation) -> CheckResult:
    gpus = selected_smi_gpus(obs)
    if not gpus:
        return skipped("GPUs in use", AREA, "no GPU information (nvidia-smi)")
    busy = []
    for g in gpus:
        used, total = g.memory_used_mib, g.memory_total_mib
        heavy = used is not None and total and used > BUSY_MEMORY_FRACTION * total
        if heavy or (g.utilization_pct or 0) > BUSY_UTILIZATION_PCT:
            busy.append(f"GPU {g.index}: {used} of {total} MiB used, {g.utilization_pct}% busy")
    if busy:
        return warn(
            "GPUs in use",
            AREA,
            "already busy: " + "; ".join(busy),
            "See who: `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`; "
            "stop them or pick other GPUs with --gpus.",
        )
    return ok("GPUs in use", AREA, f"{len(gpus)} GPU(s) idle (memory and utilisation)")


def check_gpu_models(obs: Observation) -> CheckResult:
    gpus = selected_smi_gpus(obs)
    names = sorted({g.name for g in gpus}) or sorted({d.name for d in obs.torch.devices})
    if not names:
        return skipped("GPU models", AREA, "no GPU")
    if len(names) > 1:
        return warn(
            "GPU models",
            AREA,
            f"mixed models: {', '.join(names)}; every step waits for the slowest, memory is capped by the smallest",
            "Train on one model only, e.g. --gpus with the indices of the identical GPUs.",
        )
    return ok("GPU models", AREA, f"all {names[0]}")


def check_compute_mode(obs: Observation) -> CheckResult:
    gpus = selected_smi_gpus(obs)
    if not gpus:
        return skipped("compute mode", AREA, "no GPU information (nvidia-smi)")
    prohibited = [g.index for g in gpus if g.compute_mode.lower() == "prohibited"]
    exclusive = [g.index for g in gpus if g.compute_mode.lower().startswith("exclusive")]
    if prohibited:
        ids = ",".join(map(str, prohibited))
        return fail(
            "compute mode",
            AREA,
            f"GPU {ids}: compute mode Prohibited (no process may use it)",
            f"sudo nvidia-smi -i {ids} -c DEFAULT",
        )
    if exclusive:
        ids = ",".join(map(str, exclusive))
        return warn(
            "compute mode",
            AREA,
            f"GPU {ids}: Exclusive_Process: one process per GPU works, but any second CUDA context on it "
            "(a rank that touches another rank's GPU, a DataLoader worker using CUDA) fails",
            f"sudo nvidia-smi -i {ids} -c DEFAULT (if you may; otherwise keep strictly one process per GPU)",
        )
    return ok("compute mode", AREA, "Default")


CHECKS = (check_selection, check_gpus, check_gpu_memory, check_gpu_models, check_compute_mode)
