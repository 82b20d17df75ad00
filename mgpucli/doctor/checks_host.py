"""Topology (GPU peer access, links, IOMMU) and host checks (/dev/shm, open files, CPUs, container)."""

from __future__ import annotations

from itertools import combinations

from mgpucli.doctor.checks_devices import selected_smi_gpus
from mgpucli.doctor.observation import Observation
from mgpucli.doctor.result import CheckResult, fail, ok, skipped, warn

TOPO = "topology"
HOST = "host"
MIB = 2**20
SHM_FAIL = 256 * MIB  # Docker's default is 64 MiB: DataLoader workers die with "bus error", NCCL's SHM fails
SHM_WARN = 1024 * MIB
NOFILE_FAIL = 1024
NOFILE_WARN = 4096
SHM_HINT = (
    "Docker: run with --shm-size=16g (or --ipc=host); Kubernetes: mount an emptyDir with medium: Memory at "
    "/dev/shm; bare metal: sudo mount -o remount,size=16G /dev/shm"
)


def _gpu_pairs(obs: Observation) -> list[tuple[int, int]]:
    return list(combinations(obs.plan.gpu_indices, 2)) if obs.plan.kind == "cuda" else []


def check_p2p(obs: Observation) -> CheckResult:
    name = "P2P access"
    pairs = _gpu_pairs(obs)
    if not pairs:
        return skipped(name, TOPO, "fewer than 2 GPUs selected")
    p2p = obs.torch.p2p
    if len(p2p) < max(max(p) for p in pairs) + 1:
        return skipped(name, TOPO, "torch did not report peer access")
    missing = [f"{i}<->{j}" for i, j in pairs if not (p2p[i][j] and p2p[j][i])]
    if missing:
        return warn(
            name,
            TOPO,
            f"no peer-to-peer access between GPU {', '.join(missing)}: NCCL copies through host memory (slower)",
            "Check `nvidia-smi topo -p2p r`; in VMs enable P2P in the hypervisor, on bare metal disable PCIe ACS "
            "or the IOMMU (see the IOMMU check).",
        )
    return ok(name, TOPO, f"every pair of the {len(obs.plan.gpu_indices)} selected GPUs can access each other")


def check_links(obs: Observation) -> CheckResult:
    name = "GPU links"
    gpus = selected_smi_gpus(obs)
    if len(gpus) < 2 or obs.plan.kind != "cuda":
        return skipped(name, TOPO, "fewer than 2 GPUs selected")
    if obs.smi.topo_error is not None:
        return skipped(name, TOPO, f"no link matrix: {obs.smi.topo_error.message}")
    links = {(a.index, b.index): obs.smi.links.get((a.index, b.index), "?") for a, b in combinations(gpus, 2)}
    shown = ", ".join(f"{i}-{j}: {link}" for (i, j), link in links.items())
    far = [f"{i}-{j}" for (i, j), link in links.items() if link == "SYS"]
    if far:
        return warn(
            name,
            TOPO,
            f"{shown}; GPU {', '.join(far)} talk across the CPU socket interconnect (SYS): slow all-reduce",
            "Prefer GPUs on one NUMA node (`nvidia-smi topo -m`, then --gpus with those indices).",
        )
    return ok(name, TOPO, shown + " (NV# NVLink, PIX/PXB PCIe switch, PHB/NODE host bridge)")


def check_iommu(obs: Observation) -> CheckResult:
    name = "IOMMU"
    h = obs.host
    if h.iommu_enabled is None:
        return skipped(name, TOPO, "cannot tell on this platform")
    if not h.iommu_enabled:
        return ok(name, TOPO, "off")
    if h.iommu_passthrough:
        return ok(name, TOPO, "on, passthrough mode (iommu=pt): GPU peer-to-peer unaffected")
    if len(obs.plan.gpu_indices) < 2 or obs.plan.kind != "cuda":
        return ok(name, TOPO, "on (translating); matters only for peer-to-peer between GPUs")
    return warn(
        name,
        TOPO,
        "on and translating: a known cause of hangs and corrupt data in GPU peer-to-peer (NCCL P2P)",
        "Add iommu=pt to the kernel command line (or disable the IOMMU in the BIOS); until then "
        "export NCCL_P2P_DISABLE=1 if the live test hangs.",
    )


def check_shm(obs: Observation) -> CheckResult:
    name = "/dev/shm"
    h = obs.host
    if h.shm_bytes is None:
        if h.platform != "linux":
            return skipped(name, HOST, f"not Linux ({h.platform})")
        return fail(name, HOST, f"no shared memory mount: {h.shm_error}", SHM_HINT)
    size = f"{h.shm_bytes / MIB:,.0f} MiB"
    if h.shm_bytes < SHM_FAIL:
        return fail(
            name, HOST, f"{size}: too small for DataLoader workers and NCCL's shared-memory transport", SHM_HINT
        )
    if h.shm_bytes < SHM_WARN:
        return warn(name, HOST, f"{size}: large batches in DataLoader workers can run out", SHM_HINT)
    return ok(name, HOST, size)


def check_open_files(obs: Observation) -> CheckResult:
    name = "open-file limit"
    soft, hard = obs.host.nofile_soft, obs.host.nofile_hard
    if obs.host.platform == "win32":
        return skipped(name, HOST, "not applicable on Windows")
    if soft is None:
        return ok(name, HOST, "unlimited")
    target = min(hard, 65536) if hard is not None else 65536
    if hard is not None and hard < NOFILE_WARN:
        hint = "Raise the hard limit: /etc/security/limits.conf (nofile), or docker --ulimit nofile=65536:65536"
    else:
        hint = f"ulimit -n {target} (in the shell that starts training)"
    detail = f"{soft} (hard {hard if hard is not None else 'unlimited'})"
    if soft < NOFILE_FAIL:
        return fail(
            name, HOST, f"{detail}: DataLoader workers share tensors through file descriptors and run out", hint
        )
    if soft < NOFILE_WARN:
        return warn(name, HOST, f"{detail}: several DataLoader workers per process can hit 'Too many open files'", hint)
    return ok(name, HOST, detail)


def effective_cpus(obs: Observation) -> int | None:
    """CPUs the job can really use: the affinity set, capped by a cgroup quota."""
    usable, quota = obs.host.cpus_usable, obs.host.cpu_quota
    if usable is None:
        return None
    return max(1, min(usable, int(quota))) if quota else usable


def check_cpus(obs: Observation) -> CheckResult:
    name = "CPUs"
    cpus, nproc = effective_cpus(obs), obs.plan.nproc
    if cpus is None or nproc < 1:
        return skipped(name, HOST, "CPU count or process count unknown")
    quota = f" (cgroup quota {obs.host.cpu_quota:g})" if obs.host.cpu_quota else ""
    omp = obs.env.get("OMP_NUM_THREADS", "").strip()
    if omp and (not omp.isdigit() or int(omp) < 1):
        return warn(name, HOST, f"OMP_NUM_THREADS={omp!r} is not a positive integer", "unset OMP_NUM_THREADS")
    if omp and int(omp) * nproc > cpus:
        return warn(
            name,
            HOST,
            f"OMP_NUM_THREADS={omp} x {nproc} processes = {int(omp) * nproc} threads on {cpus} CPUs{quota}: "
            "oversubscribed, every process slows down",
            f"export OMP_NUM_THREADS={max(1, cpus // nproc)}",
        )
    if cpus < nproc:
        return warn(
            name,
            HOST,
            f"{nproc} processes on {cpus} CPUs{quota}: they compete for cores",
            f"Use at most {cpus} processes, or a machine with more cores.",
        )
    workers = cpus // nproc - 1
    if workers < 1:
        detail = f"{cpus} CPUs{quota} for {nproc} processes: no core left for DataLoader workers"
        if obs.plan.kind == "cpu":
            # Information, not a problem: CPU processes load their data in the main process anyway (the default
            # data.num_workers: auto is 0 on CPU), so the README's 2 processes on 2 cores need no fix.
            return ok(name, HOST, f"{detail}, and none needed: on CPU, data.num_workers: auto loads in each process")
        return warn(name, HOST, detail,
                    "Keep DataLoader num_workers=0 (the main process loads), or run fewer processes.")
    return ok(name, HOST, f"{cpus} CPUs{quota} for {nproc} processes: up to {workers} DataLoader worker(s) each")


def check_container(obs: Observation) -> CheckResult:
    kind = obs.host.container
    if kind is None:
        return ok("container", HOST, "not in a container")
    return ok("container", HOST, f"inside {kind}: its /dev/shm, file limits and GPU access apply (checked above)")


CHECKS = (check_p2p, check_links, check_iommu, check_shm, check_open_files, check_cpus, check_container)
