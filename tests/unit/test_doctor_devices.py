"""Device checks and the device plan (which processes the doctor checks the machine for)."""

from __future__ import annotations

import pytest

from mgpucli.doctor import checks_devices as dev
from mgpucli.doctor.observation import Observation, Plan, ProbeError, SmiGpu, SmiInfo, TorchDevice, TorchInfo
from mgpucli.doctor.plan import DeviceOptions, make_plan
from mgpucli.errors import UsageError

H100 = "NVIDIA H100 80GB HBM3"


def box(n: int = 2, names: tuple[str, ...] = (), used: tuple[int, ...] = (), util: tuple[int, ...] = (),
        modes: tuple[str, ...] = (), env: dict | None = None, plan: Plan | None = None,
        torch_count: int | None = None) -> Observation:  # fmt: skip
    names = names or (H100,) * n
    gpus = tuple(
        SmiGpu(index=i, name=names[i], uuid=f"GPU-000{i}-aaaa", memory_total_mib=81559,
               memory_used_mib=used[i] if used else 4, utilization_pct=util[i] if util else 0,
               compute_mode=modes[i] if modes else "Default")
        for i in range(n)
    )  # fmt: skip
    k = n if torch_count is None else torch_count
    devices = tuple(TorchDevice(names[i], 85520809984, uuid=f"000{i}-aaaa") for i in range(k))
    return Observation(
        env=env or {},
        smi=SmiInfo(found=True, gpus=gpus, driver_version="570.86", cuda_version="12.8"),
        torch=TorchInfo(version="2.13.0", cuda_build="12.8", cuda_available=bool(k), devices=devices),
        plan=plan or Plan(kind="cuda", nproc=k, gpu_indices=tuple(range(k))),
    )


# --- plan -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (DeviceOptions(gpus="2", cpu=True), "exclude each other"),
        (DeviceOptions(nproc=2), "needs --cpu"),
        (DeviceOptions(cpu=True, nproc=0), "at least 1"),
        (DeviceOptions(gpus="two"), "not a GPU count"),
        (DeviceOptions(gpus="0"), "at least 1"),
        (DeviceOptions(gpus="0,0"), "once"),
        (DeviceOptions(gpus="0,-1"), "once"),
    ],
)
def test_bad_option_shapes_are_usage_errors(opts, message):
    with pytest.raises(UsageError, match=message) as info:
        opts.validate()
    assert info.value.exit_code == 2


def test_plan_cpu():
    plan = make_plan(DeviceOptions(cpu=True, nproc=3), visible_count=8, cuda_visible_raw=None)
    assert (plan.kind, plan.nproc, plan.backend) == ("cpu", 3, "gloo")
    assert make_plan(DeviceOptions(cpu=True), visible_count=0, cuda_visible_raw=None).nproc == 2


def test_plan_default_all_gpus_and_cpu_fallback():
    plan = make_plan(DeviceOptions(), visible_count=4, cuda_visible_raw=None)
    assert (plan.kind, plan.nproc, plan.gpu_indices, plan.backend) == ("cuda", 4, (0, 1, 2, 3), "nccl")
    fallback = make_plan(DeviceOptions(), visible_count=0, cuda_visible_raw=None)
    assert (fallback.kind, fallback.nproc) == ("cpu", 2) and "no GPU visible" in fallback.note


def test_plan_gpus_subset_maps_through_cuda_visible_devices():
    plan = make_plan(DeviceOptions(gpus="1,"), visible_count=2, cuda_visible_raw="4,6")
    assert (plan.kind, plan.nproc, plan.cuda_visible_devices) == ("cuda", 1, "6")


def test_plan_unsatisfiable_gpus_is_a_finding_not_a_usage_error():
    plan = make_plan(DeviceOptions(gpus="4"), visible_count=2, cuda_visible_raw=None)
    assert plan.kind is None and "more GPUs than the 2 visible" in plan.error
    r = dev.check_selection(Observation(plan=plan))
    assert r.status == "fail" and r.hint


def test_plan_with_broken_cuda_visible_devices_checks_what_torch_sees():
    plan = make_plan(DeviceOptions(), visible_count=1, cuda_visible_raw="0,abc,1")
    assert (plan.kind, plan.gpu_indices, plan.cuda_visible_devices) == ("cuda", (0,), None)


def test_selection_ok():
    r = dev.check_selection(box())
    assert r.status == "ok" and "2 GPU processes (nccl) on GPUs 0,1" in r.detail


# --- GPUs -------------------------------------------------------------------------------------------------


def test_gpus_ok_and_hidden_count():
    r = dev.check_gpus(box(n=4, torch_count=2, env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    assert r.status == "ok" and "2 visible to torch" in r.detail and "2 more on the machine" in r.detail


def test_gpus_skipped_without_gpus():
    assert dev.check_gpus(Observation()).status == "skipped"


def test_gpus_fail_when_torch_sees_none():
    r = dev.check_gpus(box(n=2, torch_count=0, env={"CUDA_VISIBLE_DEVICES": ""}, plan=Plan(kind=None)))
    assert r.status == "fail" and "hides them" in r.detail
    cpu_run = dev.check_gpus(box(n=2, torch_count=0, plan=Plan(kind="cpu", nproc=2)))
    assert cpu_run.status == "warn"


def test_busy_gpus():
    assert dev.check_gpu_memory(box()).status == "ok"
    r = dev.check_gpu_memory(box(used=(4, 60000)))
    assert r.status == "warn" and "GPU 1" in r.detail and "GPU 0" not in r.detail
    assert "--query-compute-apps" in r.hint
    assert dev.check_gpu_memory(box(util=(95, 0))).status == "warn"
    assert dev.check_gpu_memory(Observation(smi=SmiInfo(error=ProbeError("x")))).status == "skipped"


def test_busy_only_counts_selected_gpus():
    plan = Plan(kind="cuda", nproc=1, gpu_indices=(0,))
    assert dev.check_gpu_memory(box(used=(4, 60000), plan=plan)).status == "ok"


def test_mixed_models():
    assert dev.check_gpu_models(box()).status == "ok"
    mixed = dev.check_gpu_models(box(names=(H100, "NVIDIA A100-SXM4-40GB")))
    assert mixed.status == "warn" and "slowest" in mixed.detail
    assert dev.check_gpu_models(Observation()).status == "skipped"


def test_compute_mode():
    assert dev.check_compute_mode(box()).status == "ok"
    excl = dev.check_compute_mode(box(modes=("Default", "Exclusive_Process")))
    assert excl.status == "warn" and "-i 1 -c DEFAULT" in excl.hint
    prohibited = dev.check_compute_mode(box(modes=("Prohibited", "Default")))
    assert prohibited.status == "fail" and "-i 0 -c DEFAULT" in prohibited.hint
    assert dev.check_compute_mode(Observation()).status == "skipped"
