"""Parameters that differ across ranks, and ranks that took different numbers of optimizer steps.

A global optimizer step hook counts every optimizer's steps. At steps 1, 2, 4, ..., 64 and then every 64 (every 128,
256... when that would cost more than :data:`BUDGET` of the training time), it takes a fingerprint of the optimizer's
parameters: each parameter's sum and norm, on the parameters' device, on the script's current stream (no RNG, no
change to any tensor). On a GPU the fingerprint is copied to pinned memory asynchronously and read by the audit's
thread once its event has completed: the script's stream is never synchronised. The ranks' fingerprints (a hash of
the exact values: a few bytes, whatever the model's size) meet in the rendezvous store
(:meth:`~mgpucli.audit.session.Session.meet`): the last rank to publish step N compares, so a rank that never
reaches step N holds nobody up. When the script ends, every rank publishes its step counts and final fingerprint (of
the parameters it still holds: a script that has freed its model is compared on its step counts alone): the last
one to finish compares those, which is where ranks that took different numbers of steps are found.

Sharded parameters (FSDP, DTensor, the local shard of a ZeroRedundancyOptimizer) differ across ranks by design and
are not compared.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
import sys
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from mgpucli.audit import libraries
from mgpucli.audit.session import Session
from mgpucli.audit.where import user_where
from mgpucli.run_records.audit_records import Where
from mgpucli.torch_parts import is_fsdp1_flat, replace

RAMP_UNTIL = 64  # compare at optimizer steps 1, 2, 4, ..., 64, then every 64 steps
BUDGET = 0.005  # the share of training time the comparisons may take; a slower one backs off
READY_TIMEOUT_S = 60.0  # the longest the audit's thread waits for a GPU fingerprint's copy


def gap_at(steps: int, backoff: int = 1) -> int:
    """The spacing of comparisons around step ``steps`` (a power of two): the largest power of two up to ``steps``,
    at most :data:`RAMP_UNTIL`, or ``backoff`` when that is larger. A step is compared when it is a multiple of it."""
    ramp = 1 << (max(1, min(steps, RAMP_UNTIL)).bit_length() - 1)
    return max(ramp, backoff)


def next_check(steps: int, backoff: int = 1) -> int:
    """The first step after ``steps`` that is compared: 1, 2, 4, ..., 64, then every 64 (every ``backoff``).
    Every rank compares at multiples of its own power-of-two spacing, so a rank that backed off further compares at
    a subset of the others' steps: the ranks still meet there, without agreeing on anything first."""
    m = steps + 1
    while True:
        gap = gap_at(m, backoff)
        if m % gap == 0:
            return m
        m = (m // gap + 1) * gap


def backoff_for(cost_s: float, step_s: float | None, backoff: int, steps: int) -> int:
    """The spacing that keeps a comparison costing ``cost_s`` within :data:`BUDGET` of steps taking ``step_s`` (a
    power of two, never less than ``backoff``)."""
    if not step_s or step_s <= 0:
        return backoff
    needed = math.ceil(cost_s / (BUDGET * step_s))
    while gap_at(steps, backoff) < needed:
        backoff *= 2
    return backoff


def groups(values: list[Any]) -> list[list[int]]:
    """Ranks grouped by equal values (in rank order): one group when every rank agrees."""
    out: list[tuple[Any, list[int]]] = []
    for rank, value in enumerate(values):
        for known, ranks in out:
            if known == value:
                ranks.append(rank)
                break
        else:
            out.append((value, [rank]))
    return [ranks for _, ranks in out]


def agreement(found: list[list[int]]) -> str:
    """``no two ranks agree``, or which ranks agree with each other: ``ranks 0, 2 agree; ranks 1, 3 agree``."""
    if all(len(g) == 1 for g in found):
        return "no two ranks agree"
    return "; ".join(("ranks " + ", ".join(map(str, g)) + " agree") if len(g) > 1 else f"rank {g[0]} alone"
                     for g in found)


def sharded(p: torch.Tensor) -> bool:
    """A parameter that holds only this rank's part (FSDP's flat or flattened parameters, a DTensor)."""
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor) or is_fsdp1_flat(p)


class Pending:
    """A fingerprint being computed: on the CPU it is ready; on a GPU it is ready once its copy's event is."""

    def __init__(self, values: torch.Tensor, event: Any = None):
        self.values, self.event = values, event

    def result(self, timeout_s: float = READY_TIMEOUT_S) -> list[float] | None:
        if self.event is not None:
            deadline = time.monotonic() + timeout_s
            while not self.event.query():
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.002)
        return [float(v) for v in self.values.tolist()]

    def digest(self, timeout_s: float = READY_TIMEOUT_S) -> str | None:
        """What the ranks exchange: the fingerprint's count and a hash of its exact values (a few bytes in the store
        whatever the model's size; equal parameters, equal digests)."""
        values = self.result(timeout_s)
        if values is None:
            return None
        return f"{len(values)}:" + hashlib.sha1(struct.pack(f"<{len(values)}d", *values)).hexdigest()


def fingerprint(params: list[torch.Tensor], host: torch.Tensor | None = None) -> tuple[Pending, torch.Tensor | None]:
    """Each floating-point parameter's sum and 2-norm (float32 accumulation, float64 for float64 parameters), on
    their device, asynchronously on a GPU (into ``host``, a pinned buffer reused between calls). Returns the pending
    fingerprint and the pinned buffer."""
    with torch.no_grad():
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            if not p.is_floating_point() or p.numel() == 0:
                continue
            acc = torch.float64 if p.dtype == torch.float64 else torch.float32
            t = p.detach()
            by_dtype.setdefault(acc, []).extend([t.sum(dtype=acc), torch.linalg.vector_norm(t, dtype=acc)])
        if not by_dtype:
            return Pending(torch.zeros(0, dtype=torch.float64)), host
        parts = [torch.stack(v).to(torch.float64) for _, v in sorted(by_dtype.items(), key=lambda kv: str(kv[0]))]
        values = torch.cat(parts) if len(parts) > 1 else parts[0]
        if values.device.type != "cuda":
            return Pending(values), host
        if host is None or host.numel() != values.numel():
            host = torch.empty(values.numel(), dtype=torch.float64, pin_memory=True)
        stream = torch.cuda.current_stream(values.device)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
        return Pending(host, event), host


@dataclass
class Tracked:
    """One optimizer, as this rank sees it."""

    index: int  # the order in which this rank's optimizers first stepped: the same on every rank
    site: Where | None
    ref: Any  # weakref to the optimizer
    call: libraries.Call | None = None  # its first step: the training library whose code stepped it, if any
    param_ids: set[int] = field(default_factory=set)
    param_refs: list[Any] = field(default_factory=list)  # weakrefs to its parameters, for the end
    steps: int = 0
    next_check: int = 1
    backoff: int = 1
    last_check: tuple[int, float] | None = None  # (steps, time) at the last comparison
    diverged: bool = False
    disabled: str | None = None
    in_flight: bool = False
    host: Any = None
    checked_steps: list[int] = field(default_factory=list)


class Divergence:
    """The optimizer hook, the comparisons and the end-of-run step count."""

    def __init__(self, session: Session):
        self.s = session
        self._tracked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._all: list[Tracked] = []
        self._sites: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def install(self) -> None:
        if not self.s.distributed:
            return
        sites = self._sites

        def placed(original):
            @functools.wraps(original)
            def __init__(opt, *args, **kwargs):
                original(opt, *args, **kwargs)
                sites[opt] = user_where()

            return __init__

        replace("torch.optim.Optimizer.__init__", placed)
        register_optimizer_step_post_hook(self.after_step)
        self.s.at_finish(self.finish)

    # ------------------------------------------------------------------------------------------ every step
    def after_step(self, opt, args, kwargs) -> None:
        t = self._tracked.get(opt)
        if t is None:
            t = self._track(opt)
        t.steps += 1
        if t.steps >= t.next_check and not t.disabled and not t.diverged:
            self._check(opt, t)

    def _track(self, opt) -> Tracked:
        params = _params(opt)
        call = libraries.here(setting=True)
        site = self._sites.get(opt) or call.where  # built where its __init__ was not watched: its first step
        t = Tracked(index=len(self._all), site=site, call=call, ref=weakref.ref(opt),
                    param_ids={id(p) for p in params}, param_refs=[weakref.ref(p) for p in params])
        if any(sharded(p) for p in params):
            t.disabled = "sharded parameters (FSDP or DTensor) differ across ranks by design"
        elif _inside_zero(opt):
            t.disabled = "the local shard of a ZeroRedundancyOptimizer"
        elif len({p.device for p in params}) > 1:
            t.disabled = "parameters on several devices"
        if t.disabled:
            self.s.note(f"optimizer {t.index}: parameters not compared ({t.disabled})")
        self._tracked[opt] = t
        self._all.append(t)
        return t

    def _check(self, opt, t: Tracked) -> None:
        if t.in_flight:  # the last GPU fingerprint is still being read: skip this one (the others' is never met)
            t.next_check = next_check(t.steps, t.backoff)
            return
        began = time.perf_counter()
        pending, t.host = fingerprint(_params(opt), t.host)
        cost = time.perf_counter() - began
        step_s = None
        if t.last_check is not None and t.steps > t.last_check[0]:
            step_s = (began - t.last_check[1]) / (t.steps - t.last_check[0])
        t.last_check = (t.steps, began)
        t.backoff = backoff_for(cost, step_s, t.backoff, t.steps)
        t.next_check = next_check(t.steps, t.backoff)
        t.in_flight = pending.event is not None
        t.checked_steps.append(t.steps)
        self.s.later(self._compare, t, t.steps, pending)

    def _compare(self, t: Tracked, step: int, pending: Pending) -> None:
        values = pending.digest()
        t.in_flight = False
        if values is None:
            self.s.note(f"optimizer {t.index}: the fingerprint at step {step} was not ready in time")
            return
        got = self.s.meet(f"params/{t.index}/{step}", values)
        if got is None:
            return
        self.s.count("parameter comparisons")
        found = groups(got)
        if len(found) > 1 and not t.diverged:
            t.diverged = True
            self._report_diverged(t, f"at optimizer step {step}", found, step)
            self.s.store().set(f"params/{t.index}/diverged", str(self.s.rank))  # the end need not say it again

    def _report_diverged(self, t: Tracked, when: str, found: list[list[int]], step: int | None) -> None:
        wrapped = bool(t.param_ids & self.s.ddp_params)
        split = agreement(found)
        details = {"optimizer": t.index, "step": step, "groups": found, "ddp": wrapped}
        if t.param_ids & self.s.unreduced:
            self.s.note(f"optimizer {t.index}: the parameters differ across ranks {when}, after a DDP model left "
                        "parameters without a gradient (that finding says why: DDP never reduced their bucket)")
            return
        if wrapped:
            self.s.report(
                "params_diverged",
                f"the parameters of a DDP model differ across ranks {when} ({split}): a rank skipped or "
                "repeated an optimizer step, or changed its parameters alone",
                "DDP averages the gradients but never resynchronises the parameters: once they differ, the ranks "
                "train different models, and what rank 0 saves is one of them.",
                "# every rank steps the same number of times: decide a skip on all ranks together\n"
                "skip = torch.tensor(0.0 if torch.isfinite(loss) else 1.0)\n"
                "dist.all_reduce(skip)\n"
                "if skip.item() == 0:\n"
                "    optimizer.step()\n"
                "# and change parameters (load a checkpoint) on every rank, before wrapping in DDP",
                t.site, details, key=f"optimizer {t.index}")
            return
        fix, cost = libraries.in_terms(
            "params_not_ddp",
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "model = DDP(model, device_ids=[local_rank])  # DDP(model) on CPUs; before creating the optimizer",
            "Nothing averages the gradients: N processes run N unrelated trainings on their own data instead of one "
            "on all of it, and what rank 0 saves saw only its share.",
            t.call.library if t.call else None, self.s.library)
        self.s.report(
            "params_diverged",
            f"the parameters differ across ranks {when} ({split}): the model is not wrapped in "
            "DistributedDataParallel, so each rank trains its own copy",
            cost, fix, t.call.place("params_not_ddp", t.site) if t.call else t.site, details,
            key=f"optimizer {t.index}")

    # ------------------------------------------------------------------------------------------ the end
    def finish(self, clean: bool) -> None:
        if not clean:
            return
        mine = []
        for t in self._all:
            opt = t.ref()
            params = _params(opt) if opt is not None else [r() for r in t.param_refs]
            pending = None
            if not t.disabled and all(p is not None for p in params):
                pending, t.host = fingerprint(params, t.host if not t.in_flight else None)
            mine.append((t, pending))
        self.s.count("optimizer steps", sum(t.steps for t in self._all))
        self.s.later(self._final, mine)

    def _final(self, mine: list[tuple[Tracked, Pending | None]]) -> None:
        data = [{"steps": t.steps, "fp": p.digest() if p is not None else None, "checked": t.checked_steps,
                 "site": asdict(t.site) if t.site is not None else None} for t, p in mine]
        got = self.s.meet("final", data)
        if got is None:
            return
        for index in range(max(len(ranks) for ranks in got)):
            per_rank = [ranks[index] if index < len(ranks) else {"steps": 0, "fp": None, "checked": []}
                        for ranks in got]
            t = next((t for t, _ in mine if t.index == index), None)
            steps = [r["steps"] for r in per_rank]
            if len(set(steps)) > 1:
                self._report_steps(t, index, steps, per_rank)
            elif (t is not None and not t.diverged and all(r["fp"] is not None for r in per_rank)
                  and not self.s.store().check([f"params/{index}/diverged"])):
                found = groups([r["fp"] for r in per_rank])
                if len(found) > 1:
                    t.diverged = True
                    self._report_diverged(t, "at the end of the script", found, steps[0])

    def _report_steps(self, t: Tracked | None, index: int, steps: list[int], per_rank: list[dict]) -> None:
        counts = ", ".join(f"rank {r}: {n}" for r, n in enumerate(steps))
        fewest = min(steps)
        unmatched = sorted({s for r in per_rank for s in r.get("checked") or [] if s > fewest})
        never = (" The audit compares through the rendezvous store, not a collective: a rank that never arrives "
                 "holds nobody up, so nothing hung.")
        if unmatched:
            behind = [r for r, n in enumerate(steps) if n < unmatched[0]]
            never = (f" The audit's comparison at step {unmatched[0]} was never completed: rank"
                     f"{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} never got there." + never)
        self.s.report(
            "optimizer_steps_differ",
            f"ranks took different numbers of optimizer steps ({counts})",
            "A rank that skips optimizer.step() keeps its parameters while the others move on, so the ranks train "
            "different models; with uneven batches per rank, DDP's collectives hang or fail at the end of an epoch."
            + never,
            "# the same number of batches on every rank\n"
            "sampler = DistributedSampler(dataset, drop_last=True)\n"
            "# a skip decided on all ranks together (dist.all_reduce a flag), never by one rank alone;\n"
            "# uneven inputs on purpose: with model.join(): ...",
            _site(t, per_rank), {"optimizer": index, "steps": steps, "unmatched_checks": unmatched},
            key=f"optimizer {index}")


def _site(t: Tracked | None, per_rank: list[dict]) -> Where | None:
    """Where an optimizer was built: this rank's record of it, or (this rank never stepped it) another rank's."""
    if t is not None and t.site is not None:
        return t.site
    for data in per_rank:
        site = data.get("site")
        if isinstance(site, dict):
            return Where(**site)
    return None


def _params(opt) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def _inside_zero(opt) -> bool:
    """This optimizer steps inside a ZeroRedundancyOptimizer's step (it holds that rank's shard only)."""
    if "torch.distributed.optim" not in sys.modules:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not opt and type(owner).__name__ == "ZeroRedundancyOptimizer":
            return True
        frame = frame.f_back
    return False
