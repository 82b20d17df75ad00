"""Rank setup: launcher variables left in the shell, their consistency, and the rendezvous port.

The doctor runs from a user's shell, never under a launcher, so any of these variables is a leftover: plain
``mgpu train`` (or ``python train.py``) would believe it is one rank of a job and wait for peers that never
come. torchrun and ``mgpu launch`` overwrite them for their workers, so they only bite outside a launcher.
"""

from __future__ import annotations

from mgpucli.distributed.env import read_rank_env
from mgpucli.doctor.host import TORCHRUN_DEFAULT_PORT
from mgpucli.doctor.observation import Observation
from mgpucli.doctor.result import CheckResult, fail, ok, warn
from mgpucli.errors import UsageError

AREA = "rank setup"
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
HOLDER_HINT = "see who holds it: `ss -ltnp 'sport = :{port}'`"


def _unset(names: list[str]) -> str:
    return "unset " + " ".join(names)


def _inconsistency(obs: Observation) -> str:
    """'' when the rank variables could describe a real job, else what is wrong with them."""
    try:
        env = read_rank_env(obs.env)
    except UsageError as err:
        return err.message
    if env.local_world_size > env.world_size:
        return f"LOCAL_WORLD_SIZE={env.local_world_size} exceeds WORLD_SIZE={env.world_size}."
    if "LOCAL_RANK" in obs.env and "LOCAL_WORLD_SIZE" in obs.env and env.local_rank >= env.local_world_size:
        return f"LOCAL_RANK={env.local_rank} does not fit LOCAL_WORLD_SIZE={env.local_world_size}."
    gpus = obs.torch.device_count
    if "LOCAL_RANK" in obs.env and gpus and env.local_rank >= gpus:
        return f"LOCAL_RANK={env.local_rank}, but only {gpus} GPU(s) are visible: cuda:{env.local_rank} does not exist."
    return ""


def check_rank_variables(obs: Observation) -> CheckResult:
    name = "rank variables"
    present = [v for v in RANK_VARS if v in obs.env]
    if not present:
        return ok(name, AREA, "none set (launchers set them per worker)")
    shown = " ".join(f"{v}={obs.env[v]}" for v in present)
    problem = _inconsistency(obs)
    if problem:
        return fail(name, AREA, f"left in this shell: {shown}. {problem}", _unset(present))
    return warn(
        name,
        AREA,
        f"left in this shell: {shown}; a script run without a launcher would join that job and wait for its peers",
        _unset(present),
    )


def check_master_port(obs: Observation) -> CheckResult:
    """A taken rendezvous port fails a job; with torchrun's c10d backend it can even join the other job."""
    name = "MASTER_PORT"
    raw = obs.env.get("MASTER_PORT")
    ports = obs.host.ports_in_use
    if raw is None:
        why = ports.get(TORCHRUN_DEFAULT_PORT)
        if why:
            return warn(
                name,
                AREA,
                f"unset; torchrun's default port {TORCHRUN_DEFAULT_PORT} is {why}: a plain `torchrun` without "
                "--standalone/--master-port would fail or join another job",
                f"Use `mgpu launch` (picks a free port) or torchrun --standalone; {HOLDER_HINT.format(port=29500)}",
            )
        return ok(name, AREA, f"unset; torchrun's default port {TORCHRUN_DEFAULT_PORT} is free")
    if not raw.strip().isdigit() or not 0 < int(raw) < 65536:
        return fail(name, AREA, f"MASTER_PORT={raw!r} is not a port number (1-65535)", "unset MASTER_PORT")
    port = int(raw)
    why = ports.get(port)
    if why is None:
        return ok(name, AREA, f"MASTER_PORT={port} (not probed)")
    if why:
        return fail(
            name,
            AREA,
            f"MASTER_PORT={port} is {why}: a job rendezvousing there fails or joins whatever holds it",
            f"unset MASTER_PORT (mgpu launch picks a free port), or {HOLDER_HINT.format(port=port)}",
        )
    return ok(name, AREA, f"MASTER_PORT={port} is free")


CHECKS = (check_rank_variables, check_master_port)
