"""A script's progress, seen at torch's public points without the script's help (a launched script worker).

Installed right after the script imports torch (:mod:`mgpucli.torch_import`), it counts

- optimizer steps, through torch's global optimizer step hook (``register_optimizer_step_post_hook``);
- entries into the public ``torch.distributed`` functions that wait for the other ranks (``init_process_group``,
  the collectives, ``barrier``, ``new_group``, point-to-point ``send``/``recv``), each wrapped: which one this rank
  is in now, how many it entered, and whether it has joined the process group.

The wrappers only set a few attributes (measured: under a microsecond per call, against over ten for a one-float
gloo all-reduce); nothing is sent or written on the script's thread. The rank's
heartbeat (:mod:`mgpucli.distributed.heartbeat`) publishes :func:`snapshot` every second to ``mgpu_progress.json``,
where the launcher's stall watch sees every rank, from the script's first line on. Inside ``torch.compile``'s
tracing the wrappers step aside (``torch.compiler.is_compiling``), so a compiled collective is traced as before.
"""

from __future__ import annotations

import functools
import resource
from collections.abc import Callable

INIT = "init_process_group"
# The public torch.distributed functions that wait for other ranks (those a version lacks are left out; each is in
# mgpucli.torch_parts.REPLACED).
WAITING = (INIT, "new_group", "barrier", "monitored_barrier", "all_reduce", "all_gather", "all_gather_into_tensor",
           "all_gather_object", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list", "gather",
           "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
           "send", "recv", "batch_isend_irecv")


class _State:
    __slots__ = ("inside", "calls", "joined", "optimizer_steps")

    def __init__(self) -> None:
        self.inside: str | None = None  # the outermost waiting function this rank is in now
        self.calls = 0  # waiting functions entered (outermost only)
        self.joined = False  # init_process_group returned
        self.optimizer_steps = 0


state = _State()


def snapshot() -> dict:
    """What the heartbeat publishes: ``{collective, calls, joined, optimizer_steps, children_cpu_s}``; the last, the
    CPU seconds of the processes the script started and waited for (``mp.spawn``'s, a subprocess's), says whether
    they did the work when the rank itself did not (:mod:`mgpucli.run_records.script_outcome`)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"collective": state.inside, "calls": state.calls, "joined": state.joined,
            "optimizer_steps": state.optimizer_steps, "children_cpu_s": round(used.ru_utime + used.ru_stime, 2)}


def install(stall_watch: bool = True) -> None:
    """Observe this process's optimizer steps and waiting ``torch.distributed`` calls (torch is imported). Without
    the launcher's stall watch (``--stall-s 0``) only ``init_process_group`` is wrapped: whether the rank joined a
    process group is still said of a script that never trained; which collective it is in would be read by nobody."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from mgpucli.torch_parts import replace

    register_optimizer_step_post_hook(_stepped)
    import torch.distributed as dist

    if not dist.is_available():
        return
    compiling = torch.compiler.is_compiling
    for name in WAITING if stall_watch else (INIT,):
        replace(f"torch.distributed.{name}", functools.partial(_observed_once, name, compiling=compiling))


def _observed_once(name: str, original: Callable, compiling: Callable[[], bool]) -> Callable:
    """``original`` observed, unless it already is (installed twice)."""
    return original if getattr(original, "_mgpu_observed", False) else observe(name, original, compiling)


def _stepped(optimizer, args, kwargs) -> None:
    state.optimizer_steps += 1


def observe(name: str, original: Callable, compiling: Callable[[], bool]) -> Callable:
    """``original`` (a ``torch.distributed`` function), counted: entered, left, and for ``init_process_group`` joined.
    A call inside another (``all_gather_object`` calls ``all_gather``) counts as the outer one."""

    @functools.wraps(original)
    def observed(*args, **kwargs):
        if state.inside is not None or compiling():
            return original(*args, **kwargs)
        state.inside = name
        state.calls += 1
        try:
            result = original(*args, **kwargs)
            if name == INIT:
                state.joined = True
            return result
        finally:
            state.inside = None

    observed._mgpu_observed = True  # type: ignore[attr-defined]
    return observed
