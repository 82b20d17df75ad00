"""NCCL / torch.distributed variables, from the environment and from nccl.conf."""

from __future__ import annotations

from mgpucli.doctor import checks_nccl as nc
from mgpucli.doctor.host import parse_nccl_conf
from mgpucli.doctor.observation import HostInfo, Observation, Plan

GPU = Plan(kind="cuda", nproc=2, gpu_indices=(0, 1))
IFACES = ("lo", "eth0", "eth1", "docker0", "ib0")


def obs(env: dict[str, str] | None = None, conf: dict | None = None, plan: Plan = GPU) -> Observation:
    return Observation(env=env or {}, host=HostInfo(interfaces=IFACES, nccl_conf=conf or {}), plan=plan)


def test_debug_settings_ok_when_absent_or_off():
    assert nc.check_nccl_debug_settings(obs()).status == "ok"
    assert nc.check_nccl_debug_settings(obs({"NCCL_P2P_DISABLE": "0"})).status == "ok"


def test_debug_settings_from_env_and_conf():
    r = nc.check_nccl_debug_settings(
        obs({"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}, conf={"NCCL_SHM_DISABLE": ("1", "/etc/nccl.conf")})
    )
    assert r.status == "warn"
    assert "NCCL_SHM_DISABLE=1 (/etc/nccl.conf)" in r.detail
    assert "unset NCCL_P2P_DISABLE" in r.hint and "remove NCCL_SHM_DISABLE from /etc/nccl.conf" in r.hint
    assert "unset NCCL_ALGO" in r.hint


def test_environment_beats_conf():
    r = nc.check_nccl_debug_settings(obs({"NCCL_IB_DISABLE": "0"}, conf={"NCCL_IB_DISABLE": ("1", "/etc/nccl.conf")}))
    assert r.status == "ok"


def test_parse_nccl_conf():
    text = "# comment\nNCCL_P2P_LEVEL=NVL\n\nNCCL_DEBUG = INFO  # trailing\nnonsense\n"
    assert parse_nccl_conf(text) == {"NCCL_P2P_LEVEL": "NVL", "NCCL_DEBUG": "INFO"}


def test_ifname_matching_rules():
    assert nc.nccl_ifname_matches("eth", IFACES) == ["eth0", "eth1"]
    assert nc.nccl_ifname_matches("=eth", IFACES) == []
    assert nc.nccl_ifname_matches("=eth1", IFACES) == ["eth1"]
    assert nc.nccl_ifname_matches("^docker,lo", IFACES) == ["eth0", "eth1", "ib0"]
    assert nc.nccl_ifname_matches("^=eth0", IFACES) == ["lo", "eth1", "docker0", "ib0"]


def test_socket_ifname():
    assert nc.check_nccl_socket_ifname(obs()).status == "ok"
    assert nc.check_nccl_socket_ifname(obs({"NCCL_SOCKET_IFNAME": "eth0"})).status == "ok"
    r = nc.check_nccl_socket_ifname(obs({"NCCL_SOCKET_IFNAME": "enp1s0"}))
    assert r.status == "fail" and "matches no interface" in r.detail and "eth0" in r.hint
    cpu = nc.check_nccl_socket_ifname(obs({"NCCL_SOCKET_IFNAME": "enp1s0"}, plan=Plan(kind="cpu", nproc=2)))
    assert cpu.status == "warn"


def test_gloo_socket_ifname():
    cpu = Plan(kind="cpu", nproc=2)
    assert nc.check_gloo_socket_ifname(obs(plan=cpu)).status == "ok"
    assert nc.check_gloo_socket_ifname(obs({"GLOO_SOCKET_IFNAME": "eth0,eth1"}, plan=cpu)).status == "ok"
    r = nc.check_gloo_socket_ifname(obs({"GLOO_SOCKET_IFNAME": "eth9"}, plan=cpu))
    assert r.status == "fail" and "eth9" in r.detail
    assert nc.check_gloo_socket_ifname(obs({"GLOO_SOCKET_IFNAME": "eth9"})).status == "warn"


def test_nccl_debug_levels():
    assert nc.check_nccl_debug(obs()).status == "ok"
    assert nc.check_nccl_debug(obs({"NCCL_DEBUG": "WARN"})).status == "ok"
    assert nc.check_nccl_debug(obs({"NCCL_DEBUG": "INFO"})).status == "warn"
    assert nc.check_nccl_debug(obs(conf={"NCCL_DEBUG": ("TRACE", "/root/.nccl.conf")})).status == "warn"
    bad = nc.check_nccl_debug(obs({"NCCL_DEBUG": "VERBOSE"}))
    assert bad.status == "warn" and "not a level" in bad.detail


def test_async_error_handling():
    assert nc.check_async_error_handling(obs()).status == "ok"
    assert nc.check_async_error_handling(obs({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})).status == "ok"
    off = nc.check_async_error_handling(obs({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}))
    assert off.status == "warn" and off.hint == "unset TORCH_NCCL_ASYNC_ERROR_HANDLING"
    legacy = nc.check_async_error_handling(obs({"NCCL_ASYNC_ERROR_HANDLING": "0"}))
    assert legacy.status == "warn"


def test_torch_debug_settings():
    assert nc.check_torch_debug_settings(obs({"TORCH_DISTRIBUTED_DEBUG": "OFF"})).status == "ok"
    r = nc.check_torch_debug_settings(obs({"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
                                           "CUDA_LAUNCH_BLOCKING": "1"}))  # fmt: skip
    assert r.status == "warn"
    assert r.hint == "unset TORCH_NCCL_BLOCKING_WAIT CUDA_LAUNCH_BLOCKING TORCH_DISTRIBUTED_DEBUG"
    bad = nc.check_torch_debug_settings(obs({"TORCH_DISTRIBUTED_DEBUG": "ALL"}))
    assert bad.status == "fail" and "refuses to import" in bad.detail
