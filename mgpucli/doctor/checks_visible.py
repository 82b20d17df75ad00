"""CUDA_VISIBLE_DEVICES, read exactly as CUDA reads it, and CUDA_DEVICE_ORDER."""

from __future__ import annotations

from mgpucli.distributed.cuda_visible import VisibleDevices, parse_cuda_visible_devices, resolve_visible_devices
from mgpucli.doctor.observation import Observation
from mgpucli.doctor.result import CheckResult, fail, ok, warn

AREA = "GPU visibility"
NAME = "CUDA_VISIBLE_DEVICES"
ORDER_HINT = "export CUDA_DEVICE_ORDER=PCI_BUS_ID"


def suggested_value(vis: VisibleDevices, gpu_count: int | None, uuids: tuple[str, ...] = ()) -> str:
    """The value the user most likely meant: every readable entry once, existing, in order ('' if none)."""
    keep: list[str] = []
    invalid = () if vis.invalid is None else (vis.invalid,)
    for part in (*vis.entries, *invalid, *vis.dropped):  # the invalid entry may just be " GPU-..." or "1 "
        entry = part.strip()
        if vis.uuid_kind:
            exists = not uuids or sum(u.startswith(entry) for u in uuids) == 1
            usable = entry.startswith(vis.uuid_kind) and exists
        else:
            usable = entry.isdigit() and (gpu_count is None or int(entry) < gpu_count)
            entry = str(int(entry)) if entry.isdigit() else entry
        if usable and entry not in keep:
            keep.append(entry)
    return ",".join(keep)


def _fix(vis: VisibleDevices, gpu_count: int | None, uuids: tuple[str, ...] = ()) -> str:
    value = suggested_value(vis, gpu_count, uuids)
    return f"export CUDA_VISIBLE_DEVICES={value}" if value else "unset CUDA_VISIBLE_DEVICES"


def check_cuda_visible_devices(obs: Observation) -> CheckResult:
    raw = obs.env.get("CUDA_VISIBLE_DEVICES")
    gpu_count = len(obs.smi.gpus) if obs.smi.error is None else None
    if raw is None:
        seen = f": all {gpu_count} GPU(s) visible" if gpu_count else ""
        return ok(NAME, AREA, f"unset{seen}")
    vis = parse_cuda_visible_devices(raw)
    hidden_on_purpose = raw.strip() in ("", "-1")
    if hidden_on_purpose:
        detail = f"CUDA_VISIBLE_DEVICES={raw!r} hides every GPU"
        if obs.machine_has_gpus and obs.plan.kind != "cpu":
            return warn(NAME, AREA, f"{detail}, and this machine has some", "unset CUDA_VISIBLE_DEVICES")
        return ok(NAME, AREA, f"{detail} (fine for CPU processes)")
    uuids = tuple(g.uuid for g in obs.smi.gpus)
    res = resolve_visible_devices(vis, gpu_count, uuids)
    problems = list(vis.problems)
    if res.reason and not vis.duplicates:
        problems.append(f"CUDA_VISIBLE_DEVICES={raw!r}: {res.reason}.")
    if problems:
        # On a machine without GPUs, or for a CPU run, the value does no harm today, but the same shell on a
        # GPU box would silently train on fewer GPUs than meant.
        matters = obs.machine_has_gpus and obs.plan.kind != "cpu"
        status = fail if matters else warn
        now = "" if matters else " (no effect on this CPU run, but wrong wherever GPUs exist)."
        text = " ".join(problems)
        return status(NAME, AREA, text.rstrip(".") + now if now else text, _fix(vis, gpu_count, uuids))
    if vis.loose:
        read = ", ".join(f"{w.strip()!r} as {r}" for w, r in vis.loose)
        return warn(
            NAME,
            AREA,
            f"CUDA_VISIBLE_DEVICES={raw!r}: CUDA reads {read} (only the leading digits count)",
            _fix(vis, gpu_count, uuids),
        )
    if res.physical is None:
        where = ""
    elif vis.uuid_kind:  # UUIDs name GPUs unambiguously: show nvidia-smi's numbers
        where = f": nvidia-smi GPU(s) {','.join(map(str, res.physical))}"
    else:
        where = f": {len(res.physical)} of {gpu_count} GPU(s)"
    return ok(NAME, AREA, f"CUDA_VISIBLE_DEVICES={raw}{where}")


def check_cuda_device_order(obs: Observation) -> CheckResult:
    """CUDA numbers GPUs fastest first; nvidia-smi (and NCCL topology dumps) by PCI bus id."""
    name = "CUDA_DEVICE_ORDER"
    order = obs.env.get("CUDA_DEVICE_ORDER")
    if order not in (None, "FASTEST_FIRST", "PCI_BUS_ID"):
        return warn(
            name,
            AREA,
            f"CUDA_DEVICE_ORDER={order!r} is not a value CUDA knows (it falls back to FASTEST_FIRST)",
            ORDER_HINT,
        )
    if order == "PCI_BUS_ID":
        return ok(name, AREA, "PCI_BUS_ID: CUDA numbers GPUs like nvidia-smi")
    vis = parse_cuda_visible_devices(obs.env.get("CUDA_VISIBLE_DEVICES"))
    if vis.is_set and vis.entries and vis.uuid_kind is None:
        return warn(
            name,
            AREA,
            f"CUDA_VISIBLE_DEVICES={vis.raw} without CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA counts GPUs fastest first, "
            "nvidia-smi by PCI bus, so these indices may not be the GPUs nvidia-smi shows under them",
            ORDER_HINT,
        )
    models = {g.name for g in obs.smi.gpus}
    if len(models) > 1:
        return warn(
            name,
            AREA,
            "mixed GPU models with the default order: cuda:0 is the fastest GPU, not nvidia-smi's GPU 0",
            ORDER_HINT,
        )
    return ok(name, AREA, f"{order or 'unset (FASTEST_FIRST)'}: same numbering as nvidia-smi on identical GPUs")


CHECKS = (check_cuda_visible_devices, check_cuda_device_order)
