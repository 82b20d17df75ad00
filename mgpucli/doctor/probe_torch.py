"""Ask torch what it can reach, in a child process (``python -m mgpucli.doctor.probe_torch`` prints JSON).

Why a child: importing torch and initialising CUDA can hang on a broken driver, and a hung call in the
doctor's own process could not be interrupted. The child runs under :func:`mgpucli.proctree.run_bounded`.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from mgpucli.doctor.observation import ProbeError, TorchDevice, TorchInfo
from mgpucli.proctree import run_bounded


def _uuid(props: Any) -> str:
    raw = str(getattr(props, "uuid", "") or "")
    return raw.lower().removeprefix("gpu-")


def _cuda(torch: Any) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
    out: dict[str, Any] = {"cuda_available": available, "devices": [], "p2p": []}
    if not available:
        out["cuda_unavailable_reason"] = " ".join(str(w.message) for w in caught).strip()
        return out
    count = torch.cuda.device_count()
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        mem, cap = int(p.total_memory), f"{p.major}.{p.minor}"
        out["devices"].append({"name": p.name, "total_memory": mem, "uuid": _uuid(p), "capability": cap})
    out["p2p"] = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(count)] for i in range(count)]
    cudnn = torch.backends.cudnn
    out["cudnn_version"] = cudnn.version() if cudnn.is_available() else None
    return out


def _distributed(torch: Any) -> dict[str, Any]:
    try:
        import torch.distributed as dist
    except Exception as exc:  # e.g. TORCH_DISTRIBUTED_DEBUG=FOO makes the import raise
        return {"dist_available": False, "dist_error": f"{type(exc).__name__}: {exc}"}
    if not dist.is_available():
        return {"dist_available": False, "dist_error": "this torch build has no torch.distributed"}
    out: dict[str, Any] = {"gloo_available": dist.is_gloo_available(), "nccl_available": dist.is_nccl_available()}
    if out["nccl_available"]:
        try:
            version = torch.cuda.nccl.version()
            out["nccl_version"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:
            out["nccl_version"] = None
    return out


def probe() -> dict[str, Any]:
    """Everything the checks want from torch, as JSON-able data."""
    try:
        import torch
    except Exception as exc:
        return {"import_error": f"{type(exc).__name__}: {exc}"}
    info: dict[str, Any] = {
        "version": str(torch.__version__),
        "cuda_build": torch.version.cuda,
        "hip_build": getattr(torch.version, "hip", None),
    }
    info.update(_cuda(torch))
    info.update(_distributed(torch))
    return info


def parse(data: Mapping[str, Any]) -> TorchInfo:
    """The probe's JSON as a TorchInfo."""
    if "import_error" in data:
        return TorchInfo(error=ProbeError(f"import torch failed: {data['import_error']}"))
    devices = tuple(TorchDevice(**d) for d in data.get("devices", []))
    return TorchInfo(
        version=data.get("version", ""),
        cuda_build=data.get("cuda_build"),
        hip_build=data.get("hip_build"),
        cuda_available=bool(data.get("cuda_available")),
        cuda_unavailable_reason=data.get("cuda_unavailable_reason", ""),
        devices=devices,
        cudnn_version=data.get("cudnn_version"),
        dist_available=data.get("dist_available", True),
        dist_error=data.get("dist_error", ""),
        nccl_available=bool(data.get("nccl_available")),
        nccl_version=data.get("nccl_version"),
        gloo_available=bool(data.get("gloo_available")),
        p2p=tuple(tuple(row) for row in data.get("p2p", [])),
    )


def observe_torch(timeout: float, env: Mapping[str, str]) -> TorchInfo:
    """Run the probe in a bounded child with the user's environment (so CUDA_VISIBLE_DEVICES applies)."""
    done = run_bounded([sys.executable, "-m", "mgpucli.doctor.probe_torch"], timeout, env=env)
    if done.timed_out:
        return TorchInfo(error=ProbeError(f"importing torch and querying CUDA took over {timeout:g} s", True))
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        return TorchInfo(error=ProbeError(f"the torch probe failed (exit {done.returncode}): {tail}"))
    return parse(json.loads(lines[-1]))


if __name__ == "__main__":
    print(json.dumps(probe()))
