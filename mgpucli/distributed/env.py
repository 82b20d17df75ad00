"""Read the process's role from the environment (pure: no torch).

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE. The legacy ``python -m torch.distributed.launch``
also passes ``--local-rank=N`` (older: ``--local_rank=N``) before the script's own arguments; the CLI takes it as
a hidden top-level option and hands it here. Where LOCAL_RANK is also set, the environment wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from mgpucli.env_vars import LOCAL_RANK, LOCAL_WORLD_SIZE, RANK, WORLD_SIZE
from mgpucli.errors import UsageError

_legacy_local_rank: int | None = None


def set_legacy_local_rank(value: int | None) -> None:
    """Remember ``--local-rank=N`` given on the command line (torch.distributed.launch)."""
    global _legacy_local_rank
    _legacy_local_rank = value


@dataclass(frozen=True)
class RankEnv:
    """Who this process is in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int(environ: Mapping[str, str], key: str) -> int | None:
    raw = environ.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise UsageError(
            f"{key}={raw!r} in the environment is not an integer.",
            f"Unset it (`unset {key}`) or launch with `mgpu launch`, which sets it for every worker.",
        ) from None


def read_rank_env(environ: Mapping[str, str] | None = None, legacy_local_rank: int | None = None) -> RankEnv:
    """Parse the rank variables; a single process when none is set."""
    env = os.environ if environ is None else environ
    legacy = _legacy_local_rank if legacy_local_rank is None else legacy_local_rank
    rank = _int(env, RANK)
    world = _int(env, WORLD_SIZE)
    local_rank = _int(env, LOCAL_RANK)
    if local_rank is None:
        local_rank = legacy
    if local_rank is not None and local_rank < 0:
        raise UsageError(
            f"LOCAL_RANK={local_rank} is negative (local ranks run from 0 to the processes per node - 1).",
            "Unset the stale variables (`unset RANK WORLD_SIZE LOCAL_RANK`) or launch with `mgpu launch`.",
        )
    local_world = _int(env, LOCAL_WORLD_SIZE)
    if world is None and rank is None:
        return RankEnv(0, local_rank or 0, 1, 1)
    if world is None or rank is None:
        missing = WORLD_SIZE if world is None else RANK
        raise UsageError(
            f"RANK and WORLD_SIZE must be set together; {missing} is missing.",
            "Start workers with `mgpu launch` or torchrun, or unset the stale variables "
            "(`unset RANK WORLD_SIZE LOCAL_RANK`).",
        )
    if world < 1 or not 0 <= rank < world:
        raise UsageError(
            f"RANK={rank} does not fit WORLD_SIZE={world} (ranks run from 0 to WORLD_SIZE-1).",
            "Unset the stale variables (`unset RANK WORLD_SIZE LOCAL_RANK`) or launch with `mgpu launch`.",
        )
    if local_rank is None:
        local_rank = rank
    if local_world is None:
        local_world = world
    return RankEnv(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world)
