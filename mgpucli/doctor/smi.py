"""nvidia-smi: the driver's view of the GPUs (all of them: it ignores CUDA_VISIBLE_DEVICES).

Parsing is pure and unit-tested on captured outputs; running it is bounded by a deadline, because
nvidia-smi on a wedged driver (or without persistence mode, on many GPUs) can take very long.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Mapping

from mgpucli.doctor.observation import ProbeError, SmiGpu, SmiInfo
from mgpucli.proctree import run_bounded

QUERY_FIELDS = "index,name,uuid,pci.bus_id,memory.total,memory.used,utilization.gpu,compute_mode,driver_version"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _int(text: str) -> int | None:
    text = text.strip()
    return int(float(text)) if re.fullmatch(r"\d+(\.\d+)?", text) else None  # "[N/A]", "[Not Supported]"


def parse_query(text: str) -> tuple[tuple[SmiGpu, ...], str | None]:
    """Rows of ``--query-gpu=QUERY_FIELDS --format=csv,noheader,nounits``; returns (gpus, driver version)."""
    gpus, driver = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 9 or not cells[0].isdigit():
            continue
        extra = len(cells) - 9  # a GPU name with commas in it
        name = ", ".join(cells[1 : 2 + extra])
        rest = cells[2 + extra :]
        gpus.append(
            SmiGpu(
                index=int(cells[0]),
                name=name,
                uuid=rest[0],
                pci_bus_id=rest[1],
                memory_total_mib=_int(rest[2]),
                memory_used_mib=_int(rest[3]),
                utilization_pct=_int(rest[4]),
                compute_mode=rest[5],
            )
        )
        driver = rest[6] or driver
    return tuple(gpus), driver


def parse_cuda_version(text: str) -> str | None:
    """The 'CUDA Version: 12.4' of nvidia-smi's banner: the newest CUDA the driver supports."""
    m = re.search(r"CUDA Version\s*:\s*([0-9]+\.[0-9]+)", text)
    return m.group(1) if m else None


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """The GPU x GPU block of ``nvidia-smi topo -m``: {(i, j): 'NV12' | 'PIX' | 'PXB' | 'PHB' | 'NODE' | 'SYS'}."""
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    header = next((ln for ln in lines if ln.strip().startswith("GPU0")), None)
    if header is None:
        return {}
    gpu_cols = [int(c[3:]) for c in header.split() if re.fullmatch(r"GPU\d+", c)]
    links: dict[tuple[int, int], str] = {}
    for ln in lines:
        m = re.match(r"GPU(\d+)\s", ln)
        if not m or ln is header:
            continue
        cells = ln.split()[1:]  # GPU cells come first and hold no spaces (tabs or spaces alike)
        for j, cell in zip(gpu_cols, cells, strict=False):
            if cell and cell != "X":
                links[(int(m.group(1)), j)] = cell
    return links


def _run(args: list[str], deadline: float, env: Mapping[str, str]) -> tuple[str, ProbeError | None]:
    left = deadline - time.monotonic()
    if left <= 0:
        return "", ProbeError("no time left for nvidia-smi", timed_out=True)
    done = run_bounded(args, left, env=env)
    if done.timed_out:
        return "", ProbeError(f"`{' '.join(args)}` did not answer within {left:.0f} s", timed_out=True)
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        return "", ProbeError(f"`{' '.join(args)}` failed: {said[0] if said else f'exit {done.returncode}'}")
    return done.stdout, None


def observe_smi(timeout: float, env: Mapping[str, str]) -> SmiInfo:
    """Query nvidia-smi (GPUs, driver, CUDA version, links), all within ``timeout`` seconds."""
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if exe is None:
        return SmiInfo(error=ProbeError("nvidia-smi not found (no NVIDIA driver on this machine's PATH)"))
    deadline = time.monotonic() + timeout
    out, err = _run([exe, f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits"], deadline, env)
    if err:
        return SmiInfo(error=err, found=True)
    gpus, driver = parse_query(out)
    banner, _ = _run([exe], deadline, env)
    links: dict[tuple[int, int], str] = {}
    topo_err = None
    if len(gpus) > 1:
        topo, topo_err = _run([exe, "topo", "-m"], deadline, env)
        links = parse_topology(topo)
    return SmiInfo(
        found=True,
        driver_version=driver,
        cuda_version=parse_cuda_version(banner),
        gpus=gpus,
        links=links,
        topo_error=topo_err,
    )
