"""NCCL and torch.distributed variables: debug settings left on, interfaces that do not exist.

NCCL reads its variables from the environment, then fills the unset ones from ``NCCL_CONF_FILE`` (or
``~/.nccl.conf``) and ``/etc/nccl.conf``; a setting someone put there years ago for a debug session still
applies to every job. NCCL-only problems are failures only when this run uses NCCL (GPUs); on a CPU run they
are warnings, since the same shell would break the next GPU job.
"""

from __future__ import annotations

from collections.abc import Callable

from mgpucli.doctor.observation import Observation
from mgpucli.doctor.result import CheckResult, fail, ok, warn

AREA = "distributed env"
DISABLE_FLAGS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE")  # on when non-zero
FORCING = ("NCCL_P2P_LEVEL", "NCCL_ALGO", "NCCL_PROTO")  # on when set at all
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


def nccl_setting(obs: Observation, var: str) -> tuple[str, str] | None:
    """(value, where it comes from) as NCCL sees it: the environment first, then its config files."""
    if var in obs.env:
        return obs.env[var], "environment"
    return obs.host.nccl_conf.get(var)


def _removal(var: str, source: str) -> str:
    return f"unset {var}" if source == "environment" else f"remove {var} from {source}"


def _nccl_status(obs: Observation) -> Callable[..., CheckResult]:
    return fail if obs.uses_nccl else warn


def _on(var: str, value: str) -> bool:
    if var in DISABLE_FLAGS:
        return value.strip() not in ("", "0")
    return value.strip() != ""


def check_nccl_debug_settings(obs: Observation) -> CheckResult:
    name = "NCCL debug-only settings"
    found = []
    for var in (*DISABLE_FLAGS, *FORCING):
        setting = nccl_setting(obs, var)
        if setting and _on(var, setting[0]):
            found.append((var, *setting))
    if not found:
        return ok(name, AREA, "none of " + ", ".join((*DISABLE_FLAGS, *FORCING)) + " is set")
    shown = ", ".join(f"{v}={val} ({src})" for v, val, src in found)
    unused = "" if obs.uses_nccl else " (unused by this CPU run)"
    return warn(
        name,
        AREA,
        f"{shown}: these force NCCL off its fast paths and are meant for debugging{unused}",
        "; ".join(_removal(v, src) for v, _, src in found)
        + " (keep NCCL_P2P_DISABLE=1 only if it works around a P2P hang, see IOMMU)",
    )


def nccl_ifname_matches(spec: str, interfaces: tuple[str, ...]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME selects: prefixes, '=' for exact names, '^' to exclude (whole list)."""
    text = spec.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    names = [n.strip() for n in text.split(",") if n.strip()]

    def hit(iface: str) -> bool:
        return any(iface == n if exact else iface.startswith(n) for n in names)

    return [i for i in interfaces if hit(i) != exclude]


def check_nccl_socket_ifname(obs: Observation) -> CheckResult:
    name = "NCCL_SOCKET_IFNAME"
    setting = nccl_setting(obs, name)
    if setting is None:
        return ok(name, AREA, "unset: NCCL picks an interface")
    value, source = setting
    ifaces = obs.host.interfaces
    if ifaces is None:
        return ok(name, AREA, f"{value!r} ({source}); interfaces unknown here")
    matches = nccl_ifname_matches(value, ifaces)
    if not matches:
        return _nccl_status(obs)(
            name,
            AREA,
            f"{name}={value!r} ({source}) matches no interface (this machine has {', '.join(ifaces)}): NCCL "
            "fails at startup with 'no socket interface found'",
            _removal(name, source) + f", or name an existing one, e.g. {name}={_guess_iface(ifaces)}",
        )
    return ok(name, AREA, f"{value!r} selects {', '.join(matches)}")


def _guess_iface(ifaces: tuple[str, ...]) -> str:
    real = [i for i in ifaces if i != "lo" and not i.startswith(("docker", "veth", "virbr", "ifb"))]
    return (real or list(ifaces) or ["lo"])[0]


def check_gloo_socket_ifname(obs: Observation) -> CheckResult:
    name = "GLOO_SOCKET_IFNAME"
    value = obs.env.get(name)
    if value is None:
        return ok(name, AREA, "unset: gloo uses the interface of the hostname")
    ifaces = obs.host.interfaces
    wanted = [n.strip() for n in value.split(",") if n.strip()]
    missing = [n for n in wanted if ifaces is not None and n not in ifaces]
    if missing or not wanted:
        have = ", ".join(ifaces or ())
        status = fail if obs.plan.kind == "cpu" else warn
        return status(
            name,
            AREA,
            f"{name}={value!r}: no interface named {', '.join(missing) or repr(value)} (this machine has {have}); "
            "gloo fails at startup",
            f"unset {name}, or export {name}={_guess_iface(ifaces or ())}",
        )
    return ok(name, AREA, f"{value}")


def check_nccl_debug(obs: Observation) -> CheckResult:
    name = "NCCL_DEBUG"
    setting = nccl_setting(obs, name)
    if setting is None:
        return ok(name, AREA, "unset (NCCL prints only errors)")
    value, source = setting
    level = value.strip().upper()
    if level not in NCCL_DEBUG_LEVELS:
        return warn(
            name,
            AREA,
            f"NCCL_DEBUG={value!r} ({source}) is not a level NCCL knows ({', '.join(NCCL_DEBUG_LEVELS)})",
            _removal(name, source) + " (or export NCCL_DEBUG=WARN)",
        )
    if level in ("INFO", "TRACE"):
        return warn(
            name,
            AREA,
            f"NCCL_DEBUG={value} ({source}): every rank logs its setup (TRACE: every call); meant for debugging",
            _removal(name, source) + " (or export NCCL_DEBUG=WARN)",
        )
    return ok(name, AREA, f"{level} ({source})")


def check_async_error_handling(obs: Observation) -> CheckResult:
    name = "NCCL async error handling"
    for var in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        value = obs.env.get(var)
        if value is None:
            continue
        if value.strip() == "0":
            return warn(
                name,
                AREA,
                f"{var}=0: when a rank fails or stalls, the others are not torn down and hang until the "
                "collective timeout",
                f"unset {var}",
            )
        if value.strip() not in ("1", "2", "3"):
            return warn(name, AREA, f"{var}={value!r} is not one of 0-3", f"unset {var}")
        return ok(name, AREA, f"{var}={value}")
    return ok(name, AREA, "default (on)")


def check_torch_debug_settings(obs: Observation) -> CheckResult:
    name = "debug-only torch settings"
    found = []
    for var in ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT", "CUDA_LAUNCH_BLOCKING"):
        if obs.env.get(var, "").strip() not in ("", "0"):
            found.append(f"{var}={obs.env[var]}")
    tdd = obs.env.get("TORCH_DISTRIBUTED_DEBUG")
    if tdd is not None and tdd.strip().upper() not in ("OFF", "INFO", "DETAIL"):
        return fail(
            name,
            AREA,
            f"TORCH_DISTRIBUTED_DEBUG={tdd!r}: torch.distributed refuses to import",
            "unset TORCH_DISTRIBUTED_DEBUG (values: OFF, INFO, DETAIL)",
        )
    if tdd is not None and tdd.strip().upper() != "OFF":
        found.append(f"TORCH_DISTRIBUTED_DEBUG={tdd}")
    if found:
        names = " ".join(f.split("=")[0] for f in found)
        return warn(
            name,
            AREA,
            f"{', '.join(found)}: debugging aids that serialise or check every GPU call / collective (slow)",
            f"unset {names}",
        )
    return ok(name, AREA, "no blocking-wait, launch-blocking or distributed-debug setting on")


CHECKS = (
    check_nccl_debug_settings,
    check_nccl_socket_ifname,
    check_gloo_socket_ifname,
    check_nccl_debug,
    check_async_error_handling,
    check_torch_debug_settings,
)
