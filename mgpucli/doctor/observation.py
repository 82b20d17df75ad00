"""What the doctor saw: plain data, filled by ``gather``, read by the pure checks.

Every field has a default so a unit test can build exactly the situation it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProbeError:
    """Why a probe gave no data: it was not there, it failed, or it ran past its timeout."""

    message: str
    timed_out: bool = False


@dataclass(frozen=True)
class TorchDevice:
    """One GPU as torch sees it (after CUDA_VISIBLE_DEVICES)."""

    name: str
    total_memory: int  # bytes
    uuid: str = ""  # without the GPU- prefix, lower case; "" when torch does not report it
    capability: str = ""


@dataclass(frozen=True)
class TorchInfo:
    """torch, its CUDA build and what it can reach; ``error`` set when the probe failed."""

    error: ProbeError | None = None
    version: str = ""
    cuda_build: str | None = None  # torch.version.cuda; None for a CPU (or ROCm) build
    hip_build: str | None = None
    cuda_available: bool = False
    cuda_unavailable_reason: str = ""  # torch's own warning when is_available() is False
    devices: tuple[TorchDevice, ...] = ()
    cudnn_version: int | None = None
    dist_available: bool = True
    dist_error: str = ""  # importing torch.distributed failed (e.g. a bad TORCH_DISTRIBUTED_DEBUG)
    nccl_available: bool = False
    nccl_version: str | None = None
    gloo_available: bool = False
    p2p: tuple[tuple[bool, ...], ...] = ()  # p2p[i][j]: visible GPU i can access GPU j

    @property
    def device_count(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class SmiGpu:
    """One physical GPU as nvidia-smi lists it (nvidia-smi ignores CUDA_VISIBLE_DEVICES)."""

    index: int
    name: str
    uuid: str  # as nvidia-smi prints it: GPU-xxxxxxxx-...
    pci_bus_id: str = ""
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_pct: int | None = None
    compute_mode: str = "Default"


@dataclass(frozen=True)
class SmiInfo:
    """nvidia-smi's view; ``error`` set when it is missing, failed or timed out."""

    error: ProbeError | None = None
    found: bool = False  # the nvidia-smi binary exists
    driver_version: str | None = None
    cuda_version: str | None = None  # the newest CUDA the driver supports
    gpus: tuple[SmiGpu, ...] = ()
    links: dict[tuple[int, int], str] = field(default_factory=dict)  # (physical i, j) -> NV12, PIX, SYS...
    topo_error: ProbeError | None = None


@dataclass(frozen=True)
class HostInfo:
    """The machine around the GPUs. ``None`` means "could not tell" (e.g. not Linux)."""

    platform: str = "linux"
    shm_bytes: int | None = None
    shm_error: str = ""
    nofile_soft: int | None = None
    nofile_hard: int | None = None
    cpus_usable: int | None = None  # affinity (taskset / cgroup cpuset)
    cpu_quota: float | None = None  # cgroup CPU quota in CPUs (docker --cpus), None when unlimited
    container: str | None = None  # "docker", "podman", "kubernetes", ... or None
    iommu_enabled: bool | None = None
    iommu_passthrough: bool = False
    interfaces: tuple[str, ...] | None = None
    nccl_conf: dict[str, tuple[str, str]] = field(default_factory=dict)  # VAR -> (value, file it came from)
    ports_in_use: dict[int, str] = field(default_factory=dict)  # port probed -> "" free, else why taken


@dataclass(frozen=True)
class TrackerInfo:
    """An experiment tracker as this environment would run it (observed without importing it or asking a server)."""

    name: str  # wandb | mlflow (as trainer.loggers names it)
    version: str | None = None  # None: not installed
    mode: str = ""  # W&B: online, offline or disabled; MLflow: the tracking URI
    why: str = ""  # what decided the mode
    problem: str = ""  # why it would not run as it is asked to (W&B online without credentials, a missing module)


@dataclass(frozen=True)
class Plan:
    """What the doctor checks the machine for: which processes, on which devices."""

    kind: str | None  # "cuda", "cpu", or None when the requested selection cannot run here
    nproc: int = 0
    gpu_indices: tuple[int, ...] = ()  # among the GPUs torch sees
    cuda_visible_devices: str | None = None  # value for the workers (None: leave the env as it is)
    note: str = ""  # how the plan was chosen (e.g. the CPU fallback)
    error: str = ""  # why the requested selection cannot run here
    hint: str = ""

    @property
    def backend(self) -> str | None:
        return {"cuda": "nccl", "cpu": "gloo"}.get(self.kind or "")

    def describe(self) -> str:
        s = "" if self.nproc == 1 else "es"
        if self.kind == "cuda":
            return f"{self.nproc} GPU process{s} (nccl)"
        if self.kind == "cpu":
            return f"{self.nproc} CPU process{s} (gloo)"
        return "no runnable device selection"


@dataclass(frozen=True)
class Observation:
    """Everything the checks read."""

    env: dict[str, str] = field(default_factory=dict)
    python_version: str = "3.11.0"
    mgpu_version: str = "0.0.0"
    torch: TorchInfo = field(default_factory=TorchInfo)
    smi: SmiInfo = field(default_factory=lambda: SmiInfo(error=ProbeError("nvidia-smi not found")))
    host: HostInfo = field(default_factory=HostInfo)
    plan: Plan = field(default_factory=lambda: Plan(kind="cpu", nproc=2))
    trackers: tuple[TrackerInfo, ...] = ()

    @property
    def machine_has_gpus(self) -> bool:
        """NVIDIA GPUs exist on this machine, whether or not this process may use them."""
        return bool(self.smi.gpus) or self.torch.device_count > 0

    @property
    def uses_nccl(self) -> bool:
        return self.plan.kind == "cuda"
