"""Software checks: Python, mgpu, torch and its CUDA build, the driver, cuDNN, NCCL, gloo, experiment trackers."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from mgpucli import trackers
from mgpucli.distributed.cuda_visible import parse_cuda_visible_devices
from mgpucli.doctor.observation import Observation, ProbeError, TrackerInfo
from mgpucli.doctor.result import CheckResult, fail, ok, skipped, warn

AREA = "software"
MIN_TORCH = (2, 13)  # pyproject's floors: the oldest versions tested (README: "Tested versions")
MIN_PYTHON = (3, 11)
WHEELS = "https://download.pytorch.org/whl"


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'2.13.0+cu128' -> (2, 13, 0); '' -> ()."""
    m = re.match(r"(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def _torch_missing(obs: Observation, name: str) -> CheckResult | None:
    if obs.torch.error is None:
        return None
    return skipped(name, AREA, "torch could not be queried (see the torch check)")


def check_python(obs: Observation) -> CheckResult:
    if version_tuple(obs.python_version)[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return fail("python", AREA, f"Python {obs.python_version}", f"Use Python {need} or newer (e.g. a new venv).")
    return ok("python", AREA, f"Python {obs.python_version}")


def check_mgpu(obs: Observation) -> CheckResult:
    return ok("mgpu", AREA, f"mgpu {obs.mgpu_version}")


def _import_hint(message: str) -> str:
    """Not installed, broken by an environment variable, or a broken install: three different fixes."""
    if "No module named 'torch'" in message:
        return "Install torch in this environment: `pip install torch`."
    if "TORCH_DISTRIBUTED_DEBUG" in message:
        return "unset TORCH_DISTRIBUTED_DEBUG (values: OFF, INFO, DETAIL)"
    return "torch is installed but does not import: fix what the error names, or `pip install --force-reinstall torch`."


def check_torch(obs: Observation) -> CheckResult:
    t = obs.torch
    if t.error is not None:
        if t.error.timed_out:
            return fail(
                "torch",
                AREA,
                t.error.message,
                "A hung GPU driver is the usual cause: run `nvidia-smi`, look for Xid errors in `sudo dmesg`; "
                "raise --timeout if the machine is just slow.",
            )
        return fail("torch", AREA, t.error.message, _import_hint(t.error.message))
    if version_tuple(t.version)[:2] < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        return fail("torch", AREA, f"torch {t.version} (mgpu needs {need}+)", f"pip install 'torch>={need}'")
    return ok("torch", AREA, f"torch {t.version}")


def check_torch_cuda_build(obs: Observation) -> CheckResult:
    name = "torch CUDA build"
    t = obs.torch
    if (missing := _torch_missing(obs, name)) is not None:
        return missing
    if t.cuda_build:
        return ok(name, AREA, f"built for CUDA {t.cuda_build}")
    if t.hip_build:
        return ok(name, AREA, f"ROCm build (HIP {t.hip_build})")
    if obs.smi.gpus:
        tag = _wheel_tag(obs.smi.cuda_version)
        return fail(
            name,
            AREA,
            f"torch {t.version} is a CPU-only build, but this machine has {len(obs.smi.gpus)} NVIDIA GPU(s)",
            f"pip install --force-reinstall torch --index-url {WHEELS}/{tag} (a CUDA no newer than the driver's "
            f"{obs.smi.cuda_version or '?'}; see pytorch.org/get-started)",
        )
    return skipped(name, AREA, f"CPU-only build ({t.version}); no NVIDIA GPU on this machine")


def _wheel_tag(driver_cuda: str | None) -> str:
    v = version_tuple(driver_cuda)
    for tag, need in (("cu128", (12, 8)), ("cu126", (12, 6)), ("cu118", (11, 8))):
        if v >= need:
            return tag
    return "cu118"


def _smi_failed(err: ProbeError) -> CheckResult:
    """nvidia-smi exists but did not answer (hung driver) or failed (module / library mismatch)."""
    if err.timed_out:
        hint = "The driver may be hung: check `sudo dmesg | grep -i xid`; persistence mode: `sudo nvidia-smi -pm 1`."
    else:
        hint = "The kernel module and driver libraries disagree or are missing: reboot, or reinstall the driver."
    return fail("CUDA driver", AREA, err.message, hint)


def _no_smi(obs: Observation) -> CheckResult:
    """No nvidia-smi: fine on a CPU machine, a failure when torch expects CUDA and cannot reach it."""
    t = obs.torch
    if t.cuda_build and t.cuda_available:
        return ok("CUDA driver", AREA, "the driver works (nvidia-smi is not on PATH)")
    if t.cuda_build and t.error is None:
        inside = f" (inside {obs.host.container}: start it with `--gpus all`)" if obs.host.container else ""
        return fail(
            "CUDA driver",
            AREA,
            f"torch is built for CUDA {t.cuda_build}, but no NVIDIA driver was found{inside}",
            "Install the NVIDIA driver (or, to train on CPUs, use --cpu --nproc N).",
        )
    return skipped("CUDA driver", AREA, "no NVIDIA driver (nvidia-smi not found): CPU only")


def _hidden_by_cuda_visible_devices(obs: Observation) -> bool:
    vis = parse_cuda_visible_devices(obs.env.get("CUDA_VISIBLE_DEVICES"))
    return vis.is_set and (not vis.entries or bool(vis.duplicates))


def check_cuda_driver(obs: Observation) -> CheckResult:
    name = "CUDA driver"
    t, smi = obs.torch, obs.smi
    if smi.error is not None:
        return _smi_failed(smi.error) if smi.found else _no_smi(obs)
    detail = f"driver {smi.driver_version or '?'}, supports CUDA up to {smi.cuda_version or '?'}"
    need, have = version_tuple(t.cuda_build)[:2], version_tuple(smi.cuda_version)[:2]
    if need and have and need[0] > have[0]:
        return fail(
            name,
            AREA,
            f"{detail}; torch needs CUDA {t.cuda_build}",
            f"Upgrade the NVIDIA driver, or install torch for CUDA {have[0]}: pip install torch --index-url "
            f"{WHEELS}/{_wheel_tag(smi.cuda_version)}",
        )
    if t.cuda_build and t.error is None and not t.cuda_available and smi.gpus:
        if _hidden_by_cuda_visible_devices(obs):  # not the driver's fault: see the CUDA_VISIBLE_DEVICES check
            return ok(name, AREA, f"{detail}; torch sees no GPU because CUDA_VISIBLE_DEVICES hides them")
        reason = t.cuda_unavailable_reason or "torch.cuda.is_available() is False"
        return fail(
            name,
            AREA,
            f"{detail}; torch cannot use the GPUs: {reason}",
            "Reboot after a driver update, or reinstall the driver; check `nvidia-smi` and "
            "`sudo dmesg | grep -i nvidia`.",
        )
    if need and have and need > have:
        return warn(
            name,
            AREA,
            f"{detail}; torch is built for CUDA {t.cuda_build} (runs through minor-version compatibility, "
            "but kernels that need a newer driver fail)",
            f"Upgrade the NVIDIA driver to one that supports CUDA {t.cuda_build}.",
        )
    return ok(name, AREA, detail)


def check_cudnn(obs: Observation) -> CheckResult:
    t = obs.torch
    if (missing := _torch_missing(obs, "cuDNN")) is not None:
        return missing
    if not t.cuda_build or not t.cuda_available:
        return skipped("cuDNN", AREA, "no usable CUDA")
    if t.cudnn_version is None:
        return warn(
            "cuDNN",
            AREA,
            "torch cannot load cuDNN: convolutions will be slow or fail",
            "Reinstall torch from the official wheels (they bundle cuDNN): pip install --force-reinstall torch",
        )
    v = t.cudnn_version
    return ok("cuDNN", AREA, f"cuDNN {v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else f"cuDNN {v}")


def check_nccl(obs: Observation) -> CheckResult:
    t = obs.torch
    if (missing := _torch_missing(obs, "NCCL")) is not None:
        return missing
    if not t.dist_available:
        return _dist_broken("NCCL", obs)
    if t.nccl_available:
        return ok("NCCL", AREA, f"NCCL {t.nccl_version or '(version unknown)'}")
    if obs.uses_nccl:
        return fail(
            "NCCL",
            AREA,
            "this torch build has no NCCL: GPU processes cannot talk to each other",
            "Install a CUDA build of torch on Linux: pip install torch (pytorch.org/get-started).",
        )
    return skipped("NCCL", AREA, "not used: CPU processes talk through gloo")


def check_gloo(obs: Observation) -> CheckResult:
    t = obs.torch
    if (missing := _torch_missing(obs, "gloo")) is not None:
        return missing
    if not t.dist_available:
        return _dist_broken("gloo", obs)
    if t.gloo_available:
        return ok("gloo", AREA, "gloo available (CPU collectives)")
    detail = "this torch build has no gloo backend"
    hint = "Install torch from the official wheels: pip install torch."
    return fail("gloo", AREA, detail, hint) if obs.plan.kind == "cpu" else warn("gloo", AREA, detail, hint)


def _dist_broken(name: str, obs: Observation) -> CheckResult:
    err = obs.torch.dist_error or "torch.distributed is not available"
    hint = (
        "Fix or unset TORCH_DISTRIBUTED_DEBUG (OFF, INFO or DETAIL)."
        if "TORCH_DISTRIBUTED_DEBUG" in err
        else "Install torch from the official wheels: pip install torch."
    )
    return fail(name, AREA, f"torch.distributed does not load: {err}", hint)


def _tracker(obs: Observation, name: str) -> TrackerInfo:
    return next((t for t in obs.trackers if t.name == name), TrackerInfo(name))


def check_tracker(obs: Observation, name: str) -> CheckResult:
    """A registered experiment tracker (:mod:`mgpucli.trackers`): installed or not, and its mode here."""
    spec = trackers.SPECS[name]
    t = _tracker(obs, name)
    if t.version is None:
        return skipped(spec.title, AREA, f"not installed (optional, for trainer.loggers: [{name}]: {spec.pip})")
    if t.problem:
        return warn(spec.title, AREA, f"{spec.module} {t.version}; {t.problem}", spec.fix)
    return ok(spec.title, AREA, f"{spec.module} {t.version}; {spec.shows(trackers.Observed(t.mode, t.why))}")


def tracker_checks() -> tuple[Callable[[Observation], CheckResult], ...]:
    """One check per tracker registered now."""
    return tuple(functools.partial(check_tracker, name=name) for name in trackers.SPECS)


CHECKS = (
    check_python,
    check_mgpu,
    check_torch,
    check_torch_cuda_build,
    check_cuda_driver,
    check_cudnn,
    check_nccl,
    check_gloo,
)  # then tracker_checks()
