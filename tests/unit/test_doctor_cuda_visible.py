"""CUDA_VISIBLE_DEVICES as CUDA reads it: the parser, its resolution against the GPUs, and the doctor checks."""

from __future__ import annotations

import pytest

from mgpucli.distributed.cuda_visible import parse_cuda_visible_devices, resolve_visible_devices
from mgpucli.doctor.checks_visible import check_cuda_device_order, check_cuda_visible_devices, suggested_value
from mgpucli.doctor.observation import Observation, Plan, SmiGpu, SmiInfo, TorchDevice, TorchInfo

UUIDS = ("GPU-1a2b3c4d-0000-0000-0000-000000000000", "GPU-1a2bffff-0000-0000-0000-000000000001",
         "GPU-9e8d7c6b-0000-0000-0000-000000000002", "GPU-55554444-0000-0000-0000-000000000003")  # fmt: skip


def gpu_box(env: dict[str, str], n: int = 4, plan: Plan | None = None, names: tuple[str, ...] = ()) -> Observation:
    """A machine with ``n`` NVIDIA GPUs (nvidia-smi works), torch seeing all of them."""
    names = names or ("NVIDIA H100 80GB HBM3",) * n
    gpus = tuple(SmiGpu(index=i, name=names[i], uuid=UUIDS[i]) for i in range(n))
    devices = tuple(TorchDevice(name=names[i], total_memory=80 * 2**30) for i in range(n))
    return Observation(
        env=env,
        smi=SmiInfo(found=True, gpus=gpus, driver_version="550.54", cuda_version="12.4"),
        torch=TorchInfo(version="2.13.0", cuda_build="12.4", cuda_available=True, devices=devices),
        plan=plan or Plan(kind="cuda", nproc=n, gpu_indices=tuple(range(n))),
    )


def cpu_box(env: dict[str, str], plan: Plan | None = None) -> Observation:
    return Observation(env=env, plan=plan or Plan(kind="cpu", nproc=2))


# --- the parser -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "entries", "invalid", "dropped"),
    [
        ("0,1", ("0", "1"), None, ()),
        ("2,0", ("2", "0"), None, ()),
        (" 1 , 2", ("1", "2"), None, ()),  # index entries are read with leading/trailing blanks ignored
        ("01", ("1",), None, ()),
        ("0,1,abc,2", ("0", "1"), "abc", ("2",)),  # stops at the first invalid entry, silently
        ("abc", (), "abc", ()),
        ("0,-1,1", ("0",), "-1", ("1",)),  # a negative index stops the list
        ("0,,1", ("0",), "", ("1",)),  # an empty entry mid-list stops it too
        ("0,1,", ("0", "1"), None, ()),  # a trailing comma loses nothing
        ("0,GPU-1a2b", ("0",), "GPU-1a2b", ()),  # a UUID in an index list is invalid
        ("GPU-1a2b,GPU-9e8d", ("GPU-1a2b", "GPU-9e8d"), None, ()),
        ("GPU-1a2b,1", ("GPU-1a2b",), "1", ()),  # an index in a UUID list is invalid
        ("GPU-1a2b, GPU-9e8d", ("GPU-1a2b",), " GPU-9e8d", ()),  # UUIDs are not stripped
        ("MIG-GPU-1a2b/1/0,MIG-GPU-1a2b/2/0", ("MIG-GPU-1a2b/1/0", "MIG-GPU-1a2b/2/0"), None, ()),
        ("MIG-abcd,GPU-1a2b", ("MIG-abcd",), "GPU-1a2b", ()),  # MIG and GPU UUIDs do not mix
    ],
)
def test_parse_entries_and_stop(raw, entries, invalid, dropped):
    vis = parse_cuda_visible_devices(raw)
    assert (vis.entries, vis.invalid, vis.dropped) == (entries, invalid, dropped)
    assert bool(vis.problems) == (invalid is not None)


def test_unset_and_empty():
    assert parse_cuda_visible_devices(None).is_set is False
    assert parse_cuda_visible_devices(None).problems == []
    empty = parse_cuda_visible_devices("")
    assert empty.is_set and empty.entries == () and "no GPU is visible" in empty.problems[0]


def test_leading_digits_count_like_strtoul():
    vis = parse_cuda_visible_devices("1gpu2,2ampere")
    assert vis.entries == ("1", "2")
    assert vis.loose == (("1gpu2", "1"), ("2ampere", "2"))
    assert vis.problems == []


@pytest.mark.parametrize("raw", ["0,0", "1,0,1", "00,0", "GPU-1a2b,GPU-1a2b"])
def test_duplicates_hide_everything(raw):
    vis = parse_cuda_visible_devices(raw)
    assert vis.duplicates
    assert any("sees no GPU" in p for p in vis.problems)
    assert resolve_visible_devices(vis, 4, UUIDS).physical == ()


def test_indices_property():
    assert parse_cuda_visible_devices("2,0").indices == (2, 0)
    assert parse_cuda_visible_devices("GPU-1a2b").indices is None
    assert parse_cuda_visible_devices("GPU-1a2b").uuid_kind == "GPU-"


# --- against the hardware ---------------------------------------------------------------------------------


def test_resolve_unset_and_unknown_count():
    assert resolve_visible_devices(parse_cuda_visible_devices(None), 2).physical == (0, 1)
    assert resolve_visible_devices(parse_cuda_visible_devices("0,1"), None).physical is None


def test_resolve_out_of_range_stops_there():
    res = resolve_visible_devices(parse_cuda_visible_devices("1,5,0"), 4)
    assert res.physical == (1,)
    assert res.stop == "5"
    assert "no GPU 5" in res.reason and "0..3" in res.reason


def test_resolve_uuid_prefixes():
    assert resolve_visible_devices(parse_cuda_visible_devices("GPU-9e8d,GPU-5555"), 4, UUIDS).physical == (2, 3)
    ambiguous = resolve_visible_devices(parse_cuda_visible_devices("GPU-9e8d,GPU-1a2b"), 4, UUIDS)
    assert ambiguous.physical == (2,) and "matches 2 GPU" in ambiguous.reason
    unknown = resolve_visible_devices(parse_cuda_visible_devices("GPU-dead"), 4, UUIDS)
    assert unknown.physical == () and "matches no GPU" in unknown.reason
    same = resolve_visible_devices(parse_cuda_visible_devices("GPU-9e8d,GPU-9e8d7c"), 4, UUIDS)
    assert same.physical == () and "again" in same.reason


def test_resolve_mig_is_left_to_cuda():
    assert resolve_visible_devices(parse_cuda_visible_devices("MIG-abcd"), 4, UUIDS).physical is None


# --- the doctor check -------------------------------------------------------------------------------------


def test_check_unset_ok():
    r = check_cuda_visible_devices(gpu_box({}))
    assert r.status == "ok" and "all 4" in r.detail


def test_check_integers_ok():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "2,3"}))
    assert r.status == "ok" and "2 of 4" in r.detail


def test_check_uuids_ok_shows_nvidia_smi_numbers():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "GPU-9e8d,GPU-5555"}))
    assert r.status == "ok" and "nvidia-smi GPU(s) 2,3" in r.detail


def test_check_mig_ok():
    assert check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "MIG-GPU-1a2b/1/0"})).status == "ok"


def test_check_invalid_mid_list_fails_on_gpu_box():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "0,1,abc,2"}))
    assert r.status == "fail"
    assert "'abc'" in r.detail and "only 0,1 is visible" in r.detail
    assert r.hint == "export CUDA_VISIBLE_DEVICES=0,1,2"


def test_check_invalid_warns_on_cpu_machine():
    r = check_cuda_visible_devices(cpu_box({"CUDA_VISIBLE_DEVICES": "abc"}))
    assert r.status == "warn"
    assert "no effect on this CPU run" in r.detail
    assert r.hint == "unset CUDA_VISIBLE_DEVICES"


def test_check_invalid_warns_for_cpu_run_on_gpu_box():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "abc"}, plan=Plan(kind="cpu", nproc=2)))
    assert r.status == "warn"


def test_check_out_of_range_fails():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "0,7,1"}, n=2))
    assert r.status == "fail"
    assert "no GPU 7" in r.detail
    assert r.hint == "export CUDA_VISIBLE_DEVICES=0,1"


def test_check_duplicates_fail():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "0,1,0"}))
    assert r.status == "fail" and "twice" in r.detail
    assert r.hint == "export CUDA_VISIBLE_DEVICES=0,1"


def test_check_unknown_uuid_fails():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "GPU-9e8d,GPU-dead"}))
    assert r.status == "fail" and "matches no GPU" in r.detail
    assert r.hint == "export CUDA_VISIBLE_DEVICES=GPU-9e8d"


def test_check_uuid_list_with_blank_suggests_stripped():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "GPU-9e8d, GPU-5555"}))
    assert r.status == "fail"
    assert r.hint == "export CUDA_VISIBLE_DEVICES=GPU-9e8d,GPU-5555"


def test_check_empty_warns_when_gpus_exist():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": ""}, plan=Plan(kind="cpu", nproc=2)))
    assert r.status == "ok"  # hiding GPUs for a CPU run is deliberate
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": ""}))
    assert r.status == "warn" and r.hint == "unset CUDA_VISIBLE_DEVICES"
    assert check_cuda_visible_devices(cpu_box({"CUDA_VISIBLE_DEVICES": "-1"})).status == "ok"


def test_check_loose_entries_warn():
    r = check_cuda_visible_devices(gpu_box({"CUDA_VISIBLE_DEVICES": "1gpu,2"}))
    assert r.status == "warn" and "'1gpu' as 1" in r.detail
    assert r.hint == "export CUDA_VISIBLE_DEVICES=1,2"


def test_suggested_value_without_hardware_info():
    vis = parse_cuda_visible_devices("3,x,3,9")
    assert suggested_value(vis, None) == "3,9"
    assert suggested_value(vis, 4) == "3"


# --- CUDA_DEVICE_ORDER ------------------------------------------------------------------------------------


def test_order_warns_when_indices_set_without_pci_bus_id():
    r = check_cuda_device_order(gpu_box({"CUDA_VISIBLE_DEVICES": "1,0"}))
    assert r.status == "warn" and r.hint == "export CUDA_DEVICE_ORDER=PCI_BUS_ID"


def test_order_ok_with_pci_bus_id_or_uuids_or_unset():
    env = {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert check_cuda_device_order(gpu_box(env)).status == "ok"
    assert check_cuda_device_order(gpu_box({"CUDA_VISIBLE_DEVICES": "GPU-9e8d"})).status == "ok"
    assert check_cuda_device_order(gpu_box({})).status == "ok"


def test_order_warns_on_mixed_models_and_bad_values():
    mixed = gpu_box({}, n=2, names=("NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"))
    assert check_cuda_device_order(mixed).status == "warn"
    bad = check_cuda_device_order(gpu_box({"CUDA_DEVICE_ORDER": "PCI"}))
    assert bad.status == "warn" and "not a value CUDA knows" in bad.detail
