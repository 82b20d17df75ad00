"""Observe the host: shared memory, limits, CPUs, container, IOMMU, interfaces, nccl.conf, ports.

Each probe is cheap and local (files under /proc, /sys, /etc; one bind() per port) and returns None where it
cannot tell, so the checks can say "skipped" instead of guessing.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Mapping

from mgpucli import procfs
from mgpucli.cpus import available_cores
from mgpucli.doctor.observation import HostInfo
from mgpucli.launch.job_source import IN_A_POD, TORCHRUN_DEFAULT_PORT


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def shm_size(path: str = "/dev/shm") -> tuple[int | None, str]:
    """Total size of the shared-memory mount (what DataLoader workers and NCCL's SHM transport use)."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return None, f"{path}: {exc.strerror}"
    return st.f_frsize * st.f_blocks, ""


def nofile_limits() -> tuple[int | None, int | None]:
    """Soft and hard RLIMIT_NOFILE (None: unlimited or not available)."""
    try:
        import resource
    except ImportError:  # Windows
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else soft), (None if hard == inf else hard)


def cpu_quota() -> float | None:
    """The cgroup CPU quota in CPUs (``docker --cpus 4`` gives 4.0); None when unlimited or unknown."""
    try:
        v2 = _read("/sys/fs/cgroup/cpu.max")
        if v2:
            quota, _, period = v2.strip().partition(" ")
            return None if quota == "max" or not period else int(quota) / int(period)
        quota_v1 = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
        period_v1 = _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
        if quota_v1 and period_v1 and int(quota_v1) > 0:
            return int(quota_v1) / int(period_v1)
    except ValueError:  # an unexpected format: say nothing rather than guess
        pass
    return None


def container_kind(environ: Mapping[str, str]) -> str | None:
    """Which container runtime we are inside, if any (they cap /dev/shm, limits and visible GPUs)."""
    if IN_A_POD in environ:
        return "kubernetes"
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    if environ.get("container"):
        return environ["container"]
    cgroup = procfs.text(1, "cgroup") or ""
    markers = (("kubepods", "kubernetes"), ("docker", "docker"), ("containerd", "containerd"), ("lxc", "lxc"))
    for marker, kind in markers:
        if marker in cgroup:
            return kind
    return None


def iommu_state() -> tuple[bool | None, bool]:
    """(IOMMU translating DMA?, passthrough mode?). Passthrough (iommu=pt) leaves GPU peer-to-peer alone."""
    cmdline = (procfs.text("cmdline") or "").split()
    passthrough = "iommu=pt" in cmdline or "iommu.passthrough=1" in cmdline
    try:
        units = os.listdir("/sys/class/iommu")
    except OSError:
        return (None if sys.platform != "linux" else False), passthrough
    off = any(flag in cmdline for flag in ("iommu=off", "intel_iommu=off", "amd_iommu=off"))
    return bool(units) and not off, passthrough


def interfaces() -> tuple[str, ...] | None:
    try:
        return tuple(name for _, name in socket.if_nameindex())
    except OSError:
        return None


def parse_nccl_conf(text: str) -> dict[str, str]:
    """KEY=VALUE lines of an nccl.conf ('#' comments, blank lines ignored)."""
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def nccl_conf(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Settings NCCL reads from its config files: NCCL_CONF_FILE (or ~/.nccl.conf), then /etc/nccl.conf.

    The first file to set a variable wins, and the environment beats both (NCCL only fills unset vars).
    """
    user = environ.get("NCCL_CONF_FILE") or os.path.join(environ.get("HOME", "~"), ".nccl.conf")
    found: dict[str, tuple[str, str]] = {}
    for path in (user, "/etc/nccl.conf"):
        text = _read(os.path.expanduser(path))
        for key, value in parse_nccl_conf(text or "").items():
            found.setdefault(key, (value, path))
    return found


def port_status(port: int) -> str:
    """'' when a rendezvous store could listen on ``port`` now, else why not (mgpu launch's own test)."""
    from mgpucli.launch.ports import port_problem

    return port_problem(port) or ""


def ports_to_probe(environ: Mapping[str, str]) -> list[int]:
    """MASTER_PORT when it is a valid port, and torchrun's default port."""
    ports = [TORCHRUN_DEFAULT_PORT]
    raw = environ.get("MASTER_PORT", "").strip()
    if raw.isdigit() and 0 < int(raw) < 65536:
        ports.insert(0, int(raw))
    return ports


def observe_host(environ: Mapping[str, str], ports: Iterable[int] | None = None) -> HostInfo:
    shm, shm_err = shm_size() if sys.platform == "linux" else (None, "")
    soft, hard = nofile_limits()
    iommu, passthrough = iommu_state()
    return HostInfo(
        platform=sys.platform,
        shm_bytes=shm,
        shm_error=shm_err,
        nofile_soft=soft,
        nofile_hard=hard,
        cpus_usable=available_cores(),
        cpu_quota=cpu_quota(),
        container=container_kind(environ),
        iommu_enabled=iommu,
        iommu_passthrough=passthrough,
        interfaces=interfaces(),
        nccl_conf=nccl_conf(environ),
        ports_in_use={p: port_status(p) for p in (ports if ports is not None else ports_to_probe(environ))},
    )
