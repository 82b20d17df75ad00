"""Turn ``--gpus`` / ``--cpu --nproc`` into a device selection (pure: the visible GPU count is passed in).

``--gpus N`` takes the first N visible GPUs, ``--gpus 0,2,3`` those (a trailing comma makes a one-GPU list:
``--gpus 1,``), ``--gpus all`` every visible GPU; no ``--gpus`` means all visible GPUs. ``--cpu --nproc N``
runs N CPU processes with gloo. Never silently run on a different device count than asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpucli.distributed.cuda_visible import parse_cuda_visible_devices
from mgpucli.errors import UsageError


@dataclass(frozen=True)
class DeviceSelection:
    """Where the workers run."""

    kind: str  # "cuda" or "cpu"
    nproc: int
    gpu_indices: tuple[int, ...] = ()  # indices among the GPUs visible to this process
    cuda_visible_devices: str | None = None  # value to give the workers (None: leave as it is)


def _cpu_hint(visible: int) -> str:
    seen = f"{visible} GPU(s) visible" if visible else "no CUDA GPU visible"
    return f"This machine has {seen}. To run on CPUs instead: --cpu --nproc N."


def parse_gpus(spec: str) -> str | int | tuple[int, ...]:
    """'all' | a count | a tuple of indices; UsageError on anything else."""
    text = spec.strip()
    if text == "all":
        return "all"
    try:
        if "," in text:
            return tuple(int(p) for p in text.split(",") if p.strip() != "")
        return int(text)
    except ValueError:
        raise UsageError(
            f"--gpus {spec!r} is not a GPU count, a comma-separated list of GPU indices, or 'all'.",
            "Examples: --gpus 4, --gpus 0,2,3, --gpus 1, (just GPU 1), --gpus all.",
        ) from None


def check_device_options(gpus: str | None, cpu: bool, nproc: int | None) -> None:
    """The device options' rules that need nothing of the machine: UsageError."""
    if cpu and gpus is not None:
        raise UsageError("--cpu and --gpus exclude each other.", "Pick one: --gpus N for GPUs, --cpu --nproc N.")
    if nproc is not None and nproc < 1:
        raise UsageError(f"--nproc {nproc}: the process count must be at least 1.", "Example: --cpu --nproc 2.")


def select_devices(
    gpus: str | None,
    cpu: bool,
    nproc: int | None,
    visible_count: int,
    cuda_visible_raw: str | None = None,
) -> DeviceSelection:
    """Validate the device options against what is visible; UsageError names what is visible and the fix."""
    check_device_options(gpus, cpu, nproc)
    if cpu:
        return DeviceSelection(kind="cpu", nproc=nproc or 1)
    if nproc is not None:
        raise UsageError(
            "--nproc sets the number of CPU processes and needs --cpu.",
            "For GPUs use --gpus N (one process per GPU); for CPUs use --cpu --nproc N.",
        )
    visible = parse_cuda_visible_devices(cuda_visible_raw)
    if visible.problems:
        raise UsageError(
            " ".join(visible.problems),
            "Fix or unset CUDA_VISIBLE_DEVICES (e.g. `export CUDA_VISIBLE_DEVICES=0,1`), or select GPUs with --gpus.",
        )
    wanted = parse_gpus(gpus) if gpus is not None else "all"
    if visible_count == 0:
        asked = "No" if gpus is None else f"--gpus {gpus} asks for CUDA GPUs, but no"
        raise UsageError(f"{asked} CUDA GPU is visible to this process.", _cpu_hint(0))
    if wanted == "all":
        indices = tuple(range(visible_count))
    elif isinstance(wanted, int):
        if wanted < 1:
            hint = _cpu_hint(visible_count)
            if wanted == 0:
                hint = f"For GPU 0 alone, write it as a list: --gpus 0, (with the comma). {hint}"
            raise UsageError(f"--gpus {wanted}: the GPU count must be at least 1.", hint)
        if wanted > visible_count:
            raise UsageError(
                f"--gpus {wanted} asks for more GPUs than the {visible_count} visible.", _cpu_hint(visible_count)
            )
        indices = tuple(range(wanted))
    else:
        if not wanted:
            raise UsageError(f"--gpus {gpus!r} names no GPU.", _cpu_hint(visible_count))
        dups = sorted({i for i in wanted if wanted.count(i) > 1})
        if dups:
            raise UsageError(f"--gpus {gpus} names GPU {dups[0]} more than once.", "List each GPU once.")
        bad = [i for i in wanted if not 0 <= i < visible_count]
        if bad:
            raise UsageError(
                f"--gpus {gpus}: GPU {bad[0]} does not exist (visible: 0..{visible_count - 1}).",
                _cpu_hint(visible_count),
            )
        indices = tuple(wanted)
    names = visible.entries or tuple(str(i) for i in range(visible_count))  # how the workers' CUDA names them
    mapped = ",".join(names[i] for i in indices)
    cvd = None if indices == tuple(range(visible_count)) and gpus is None else mapped
    return DeviceSelection(kind="cuda", nproc=len(indices), gpu_indices=indices, cuda_visible_devices=cvd)
