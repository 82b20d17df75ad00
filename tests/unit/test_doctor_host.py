"""Topology (P2P, links, IOMMU) and host checks (/dev/shm, open files, CPUs, container)."""

from __future__ import annotations

from mgpucli.doctor import checks_host as hc
from mgpucli.doctor.observation import HostInfo, Observation, Plan, SmiGpu, SmiInfo, TorchDevice, TorchInfo

MIB = 2**20
GPU4 = Plan(kind="cuda", nproc=4, gpu_indices=(0, 1, 2, 3))


def gpu_obs(p2p=None, links=None, host: HostInfo | None = None, plan: Plan = GPU4, topo_error=None) -> Observation:
    gpus = tuple(SmiGpu(index=i, name="NVIDIA L40S", uuid=f"GPU-{i}") for i in range(4))
    devices = tuple(TorchDevice("NVIDIA L40S", 1, uuid=str(i)) for i in range(4))
    full = tuple(tuple(True for _ in range(4)) for _ in range(4))
    return Observation(
        smi=SmiInfo(found=True, gpus=gpus, links=links or {}, topo_error=topo_error),
        torch=TorchInfo(version="2.13.0", cuda_build="12.8", cuda_available=True, devices=devices, p2p=p2p or full),
        host=host or HostInfo(),
        plan=plan,
    )


def host_obs(plan: Plan | None = None, env: dict | None = None, **host) -> Observation:
    return Observation(env=env or {}, host=HostInfo(**host), plan=plan or Plan(kind="cpu", nproc=2))


def test_p2p():
    assert hc.check_p2p(gpu_obs()).status == "ok"
    p2p = [[True] * 4 for _ in range(4)]
    p2p[1][3] = p2p[3][1] = False
    r = hc.check_p2p(gpu_obs(p2p=tuple(map(tuple, p2p))))
    assert r.status == "warn" and "1<->3" in r.detail and "0<->1" not in r.detail
    assert hc.check_p2p(host_obs()).status == "skipped"


def test_links():
    nvlink = {(i, j): "NV18" for i in range(4) for j in range(4) if i != j}
    assert hc.check_links(gpu_obs(links=nvlink)).status == "ok"
    mixed = dict(nvlink)
    mixed[(0, 3)] = "SYS"
    r = hc.check_links(gpu_obs(links=mixed))
    assert r.status == "warn" and "0-3" in r.detail
    assert hc.check_links(host_obs()).status == "skipped"


def test_iommu():
    assert hc.check_iommu(gpu_obs(host=HostInfo(iommu_enabled=False))).status == "ok"
    assert hc.check_iommu(gpu_obs(host=HostInfo(iommu_enabled=True, iommu_passthrough=True))).status == "ok"
    r = hc.check_iommu(gpu_obs(host=HostInfo(iommu_enabled=True)))
    assert r.status == "warn" and "iommu=pt" in r.hint
    assert hc.check_iommu(host_obs(iommu_enabled=True)).status == "ok"  # no GPU peer traffic on a CPU run
    assert hc.check_iommu(host_obs(iommu_enabled=None)).status == "skipped"


def test_shm():
    assert hc.check_shm(host_obs(shm_bytes=16 * 1024 * MIB)).status == "ok"
    assert hc.check_shm(host_obs(shm_bytes=512 * MIB)).status == "warn"
    docker = hc.check_shm(host_obs(shm_bytes=64 * MIB))
    assert docker.status == "fail" and "--shm-size" in docker.hint
    assert hc.check_shm(host_obs(shm_bytes=None, shm_error="/dev/shm: No such file")).status == "fail"
    assert hc.check_shm(host_obs(shm_bytes=None, platform="darwin")).status == "skipped"


def test_open_files():
    assert hc.check_open_files(host_obs(nofile_soft=65536, nofile_hard=65536)).status == "ok"
    r = hc.check_open_files(host_obs(nofile_soft=1024, nofile_hard=1048576))
    assert r.status == "warn" and r.hint.startswith("ulimit -n 65536")
    low = hc.check_open_files(host_obs(nofile_soft=256, nofile_hard=1024))
    assert low.status == "fail" and "hard limit" in low.hint
    assert hc.check_open_files(host_obs(nofile_soft=None, nofile_hard=None)).status == "ok"


def test_cpus():
    four = Plan(kind="cpu", nproc=4)
    ok = hc.check_cpus(host_obs(plan=four, cpus_usable=32))
    assert ok.status == "ok" and "up to 7 DataLoader worker(s)" in ok.detail
    quota = hc.check_cpus(host_obs(plan=GPU4, cpus_usable=32, cpu_quota=4.0))
    assert quota.status == "warn" and "cgroup quota 4" in quota.detail and "no core left" in quota.detail
    assert hc.check_cpus(host_obs(plan=four, cpus_usable=2)).status == "warn"  # fewer cores than processes
    omp = hc.check_cpus(host_obs(plan=four, cpus_usable=32, env={"OMP_NUM_THREADS": "16"}))
    assert omp.status == "warn" and omp.hint == "export OMP_NUM_THREADS=8"
    assert hc.check_cpus(host_obs(plan=four, cpus_usable=32, env={"OMP_NUM_THREADS": "x"})).status == "warn"
    assert hc.check_cpus(host_obs(cpus_usable=None)).status == "skipped"


def test_one_core_per_cpu_process_is_information_not_a_warning():
    # The README's `mgpu launch --cpu --nproc 2` on a 2-core machine: CPU processes use no DataLoader workers.
    readme = hc.check_cpus(host_obs(plan=Plan(kind="cpu", nproc=2), cpus_usable=2))
    assert readme.status == "ok" and readme.hint == ""
    assert readme.detail == ("2 CPUs for 2 processes: no core left for DataLoader workers, and none needed: on CPU, "
                             "data.num_workers: auto loads in each process")
    quota = hc.check_cpus(host_obs(plan=Plan(kind="cpu", nproc=4), cpus_usable=32, cpu_quota=4.0))
    assert quota.status == "ok" and "cgroup quota 4" in quota.detail
    gpus = hc.check_cpus(host_obs(plan=Plan(kind="cuda", nproc=2, gpu_indices=(0, 1)), cpus_usable=2))
    assert gpus.status == "warn" and "num_workers=0" in gpus.hint  # GPU processes do want loader workers


def test_container():
    assert hc.check_container(host_obs(container=None)).detail == "not in a container"
    assert "docker" in hc.check_container(host_obs(container="docker")).detail
