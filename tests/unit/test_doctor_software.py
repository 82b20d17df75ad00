"""Software checks over faked observations: ok, warn, fail and skipped for each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mgpucli.doctor import checks_software as sw
from mgpucli.doctor.observation import HostInfo, Observation, Plan, ProbeError, SmiGpu, SmiInfo, TorchInfo

NO_SMI = SmiInfo(error=ProbeError("nvidia-smi not found"))
CUDA_TORCH = TorchInfo(version="2.13.0+cu128", cuda_build="12.8", cuda_available=True, cudnn_version=90100,
                       nccl_available=True, nccl_version="2.27.3", gloo_available=True)  # fmt: skip
CPU_TORCH = TorchInfo(version="2.13.0+cpu", gloo_available=True)


def smi(cuda: str = "12.8", n: int = 2) -> SmiInfo:
    gpus = tuple(SmiGpu(index=i, name="NVIDIA H100", uuid=f"GPU-{i}") for i in range(n))
    return SmiInfo(found=True, driver_version="570.86", cuda_version=cuda, gpus=gpus)


def obs(torch: TorchInfo = CPU_TORCH, smi_info: SmiInfo = NO_SMI, plan: Plan | None = None, **kw) -> Observation:
    return Observation(torch=torch, smi=smi_info, plan=plan or Plan(kind="cpu", nproc=2), **kw)


GPU_PLAN = Plan(kind="cuda", nproc=2, gpu_indices=(0, 1))


def test_version_tuple():
    assert sw.version_tuple("2.13.0+cu128") == (2, 13, 0)
    assert sw.version_tuple("12.4") == (12, 4)
    assert sw.version_tuple("") == ()


def test_python():
    assert sw.check_python(obs(python_version="3.11.7")).status == "ok"
    r = sw.check_python(obs(python_version="3.10.14"))
    assert r.status == "fail" and "3.11" in r.hint


def test_torch_ok_old_missing_and_hung():
    assert sw.check_torch(obs()).status == "ok"
    old = sw.check_torch(obs(torch=TorchInfo(version="2.6.0")))
    assert old.status == "fail" and "torch>=2.13" in old.hint
    gone = "import torch failed: ModuleNotFoundError: No module named 'torch'"
    missing = sw.check_torch(obs(torch=TorchInfo(error=ProbeError(gone))))
    assert missing.status == "fail" and "pip install torch" in missing.hint
    bad_env = "import torch failed: ValueError: The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL."
    assert sw.check_torch(obs(torch=TorchInfo(error=ProbeError(bad_env)))).hint.startswith("unset TORCH_DIST")
    broken = sw.check_torch(obs(torch=TorchInfo(error=ProbeError("import torch failed: OSError: libcudnn.so.9"))))
    assert "--force-reinstall" in broken.hint
    hung = sw.check_torch(obs(torch=TorchInfo(error=ProbeError("took over 30 s", timed_out=True))))
    assert hung.status == "fail" and "nvidia-smi" in hung.hint


def test_torch_cuda_build():
    assert sw.check_torch_cuda_build(obs(torch=CUDA_TORCH, smi_info=smi())).status == "ok"
    assert sw.check_torch_cuda_build(obs()).status == "skipped"
    r = sw.check_torch_cuda_build(obs(smi_info=smi(cuda="12.6")))
    assert r.status == "fail" and "CPU-only build" in r.detail
    assert "whl/cu126" in r.hint
    unknown = sw.check_torch_cuda_build(obs(torch=TorchInfo(error=ProbeError("x"))))
    assert unknown.status == "skipped"


def test_driver_ok_and_skipped():
    assert sw.check_cuda_driver(obs(torch=CUDA_TORCH, smi_info=smi())).status == "ok"
    assert sw.check_cuda_driver(obs()).status == "skipped"
    no_smi_but_works = sw.check_cuda_driver(obs(torch=CUDA_TORCH))
    assert no_smi_but_works.status == "ok"


def test_driver_too_old_for_torch():
    old = replace(CUDA_TORCH, cuda_build="12.8")
    major = sw.check_cuda_driver(obs(torch=old, smi_info=smi(cuda="11.8")))
    assert major.status == "fail" and "cu118" in major.hint
    minor = sw.check_cuda_driver(obs(torch=old, smi_info=smi(cuda="12.4")))
    assert minor.status == "warn" and "minor-version" in minor.detail


def test_driver_missing_for_cuda_torch_in_container():
    torch = replace(CUDA_TORCH, cuda_available=False)
    r = sw.check_cuda_driver(obs(torch=torch, host=HostInfo(container="docker")))
    assert r.status == "fail" and "--gpus all" in r.detail


def test_driver_broken_or_hung():
    broken = SmiInfo(
        found=True,
        error=ProbeError(
            "`nvidia-smi` failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
        ),
    )
    r = sw.check_cuda_driver(obs(torch=CUDA_TORCH, smi_info=broken))
    assert r.status == "fail" and "reinstall" in r.hint
    hung = SmiInfo(found=True, error=ProbeError("`nvidia-smi` did not answer within 30 s", timed_out=True))
    assert "persistence" in sw.check_cuda_driver(obs(torch=CUDA_TORCH, smi_info=hung)).hint


def test_torch_cannot_use_gpus():
    torch = replace(CUDA_TORCH, cuda_available=False, cuda_unavailable_reason="CUDA initialization: Error 804")
    r = sw.check_cuda_driver(obs(torch=torch, smi_info=smi()))
    assert r.status == "fail" and "Error 804" in r.detail


def test_cudnn():
    assert sw.check_cudnn(obs(torch=CUDA_TORCH)).detail == "cuDNN 9.1.0"
    assert sw.check_cudnn(obs()).status == "skipped"
    assert sw.check_cudnn(obs(torch=replace(CUDA_TORCH, cudnn_version=None))).status == "warn"


def test_nccl():
    assert sw.check_nccl(obs(torch=CUDA_TORCH, plan=GPU_PLAN)).detail == "NCCL 2.27.3"
    assert sw.check_nccl(obs()).status == "skipped"
    r = sw.check_nccl(obs(torch=replace(CUDA_TORCH, nccl_available=False), plan=GPU_PLAN))
    assert r.status == "fail"


def test_gloo():
    assert sw.check_gloo(obs()).status == "ok"
    assert sw.check_gloo(obs(torch=replace(CPU_TORCH, gloo_available=False))).status == "fail"
    assert sw.check_gloo(obs(torch=replace(CUDA_TORCH, gloo_available=False), plan=GPU_PLAN)).status == "warn"


@pytest.mark.parametrize("check", [sw.check_nccl, sw.check_gloo])
def test_distributed_import_broken(check):
    torch = replace(
        CPU_TORCH,
        dist_available=False,
        dist_error="ValueError: The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL.",
    )
    r = check(obs(torch=torch))
    assert r.status == "fail" and "TORCH_DISTRIBUTED_DEBUG" in r.hint


def test_gpus_hidden_by_cuda_visible_devices_is_not_a_driver_fault():
    torch = replace(CUDA_TORCH, cuda_available=False, cuda_unavailable_reason="no CUDA GPUs are available")
    r = sw.check_cuda_driver(obs(torch=torch, smi_info=smi(), env={"CUDA_VISIBLE_DEVICES": ""}))
    assert r.status == "ok" and "CUDA_VISIBLE_DEVICES hides them" in r.detail
    r = sw.check_cuda_driver(obs(torch=torch, smi_info=smi(), env={"CUDA_VISIBLE_DEVICES": "0,0"}))
    assert r.status == "ok"
