"""Fill an Observation: the environment, torch (bounded child), nvidia-smi (bounded), the host, the plan."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from mgpucli import __version__, trackers
from mgpucli.doctor.host import observe_host
from mgpucli.doctor.observation import Observation, TrackerInfo
from mgpucli.doctor.plan import DeviceOptions, make_plan
from mgpucli.doctor.probe_torch import observe_torch
from mgpucli.doctor.smi import observe_smi


def observe(devices: DeviceOptions, timeout: float, environ: Mapping[str, str]) -> Observation:
    """Everything the checks read. torch and nvidia-smi run side by side, each within ``timeout``."""
    env = dict(environ)
    with ThreadPoolExecutor(max_workers=2) as pool:
        torch_future = pool.submit(observe_torch, timeout, env)
        smi_future = pool.submit(observe_smi, timeout, env)
        host = observe_host(env)
        torch_info, smi_info = torch_future.result(), smi_future.result()
    plan = make_plan(devices, torch_info.device_count, env.get("CUDA_VISIBLE_DEVICES"))
    return Observation(
        env=env,
        python_version=platform.python_version(),
        mgpu_version=__version__,
        torch=torch_info,
        smi=smi_info,
        host=host,
        plan=plan,
        trackers=observe_trackers(env),
    )


def observe_trackers(env: Mapping[str, str]) -> tuple[TrackerInfo, ...]:
    """Every registered tracker as a run started from this shell would use it: installed (looked up, not imported),
    and its mode as the tracker's entry observes it (W&B: WANDB_MODE and credentials, no network; MLflow: the
    tracking URI)."""
    found = []
    for name, spec in trackers.SPECS.items():
        if trackers.module_problem(spec.module, importing=False) is not None:
            found.append(TrackerInfo(name))
            continue
        seen = spec.observe(env)
        found.append(TrackerInfo(name, trackers.version(spec), seen.mode, seen.why, seen.problem))
    return tuple(found)
