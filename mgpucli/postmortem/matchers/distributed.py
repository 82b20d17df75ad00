"""Failures between ranks: collective timeouts, lost peers, ranks that disagree, DDP's gradient errors."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mgpucli.postmortem.lines import LogLine, by_rank, find_all, first
from mgpucli.postmortem.matchers.base import Match, first_rank_hits, hit_ranks, of_rank, scan
from mgpucli.postmortem.tracebacks import last_exception
from mgpucli.run_layout import LAUNCH_JSON
from mgpucli.run_records.first_failure import TORN_DOWN

# ------------------------------------------------------------------------------ collective timeout
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r"(?:, NumelIn=(?P<nin>\d+), NumelOut=(?P<nout>\d+))?, Timeout\(ms\)=(?P<tmo>\d+)\) ran for (?P<ran>\d+) "
    r"milliseconds before timing out")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<tmo>\d+)ms for (?P<op>recv|send) operation to complete")
_BARRIER = re.compile(r"Ranks? (?P<late>\d+(?:, \d+)*) failed to pass monitoredBarrier in (?P<tmo>\d+) ms")
_MGPU_TIMEOUT = re.compile(r"a collective timed out after trainer\.timeout_s=(?P<tmo_s>\d+) s in '(?P<phase>[^']+)'"
                           r"(?: at step (?P<step>\d+))?")
_MGPU_LATE = re.compile(r"had not arrived: (?P<late>.+?)(?:\. \(|\.$|$)")
_STORE_TIMEOUT = re.compile(r"wait timeout after (?P<tmo>\d+)ms, keys: (?P<keys>\S+)|\bSocket Timeout\b")
_HEARTBEAT = re.compile(r"watchdog got stuck for (?P<tmo_s>\d+) seconds without making progress")
_TIMEOUTS = (_MGPU_TIMEOUT, _NCCL_TIMEOUT, _BARRIER, _GLOO_TIMEOUT, _HEARTBEAT, _STORE_TIMEOUT)
# The note a user's script gets on a timeout when it calls mgpucli.progress (mgpucli.distributed.step_progress).
_SCRIPT_STEPS = re.compile(r"mgpu: steps each rank had reached \(mgpucli\.progress\): (?P<steps>.*?)\."
                           r"(?: Ranks that had not arrived: (?P<late>.*))?$")
# Where in mgpu's (or DDP's) code a traceback's frames say the collective was called.
_CALLERS = (("read_reduction", "the log-interval all-reduce of metrics and flags"),  # waited for here
            ("close_and_reduce", "the log-interval all-reduce of metrics and flags"),  # started here
            ("_raise_nonfinite", "the ranks' agreement on the first non-finite loss"),
            ("all_gather_object", "the state gather for a checkpoint"),
            ("broadcast_object", "a setup broadcast from rank 0"),
            ("evaluate", "validation"),
            ("backward", "DDP's gradient all-reduce in backward()"),
            ("init_process_group", "process-group initialisation"))
_OPNAMES = {"ALLREDUCE": "all-reduce", "BROADCAST": "broadcast", "ALLGATHER": "all-gather", "_ALLGATHER_BASE":
            "all-gather", "REDUCE_SCATTER": "reduce-scatter", "_REDUCE_SCATTER_BASE": "reduce-scatter",
            "ALLTOALL": "all-to-all", "BARRIER": "barrier", "SEND": "send", "RECV": "recv"}


def collective_timeout(lines: Sequence[LogLine]) -> Match | None:
    hits = scan(lines, _TIMEOUTS)
    if not hits:
        return None
    # Prefer the most informative line of the first rank: mgpu's own message, NCCL's, then gloo's.
    mine = first_rank_hits(hits)
    anchor, found = min(mine, key=lambda h: next(i for i, p in enumerate(_TIMEOUTS) if p is h[1].re))
    details: dict[str, Any] = {"waiting_ranks": hit_ranks(hits)}
    late: list[int] = []
    step = None
    if found.re is _MGPU_TIMEOUT:
        details.update(collective=found["phase"], timeout_s=int(found["tmo_s"]))
        step = int(found["step"]) if found["step"] else None
        arrived = _MGPU_LATE.search(anchor.text)
        if arrived:
            late = [int(r) for r in re.findall(r"rank (\d+)", arrived["late"])]
    elif found.re is _NCCL_TIMEOUT:
        op = found["op"]
        details.update(collective=f"{_OPNAMES.get(op, op.lower())} (NCCL {op}, sequence number {found['seq']})",
                       timeout_s=int(found["tmo"]) / 1000, op=op, seq=int(found["seq"]))
        if found["nin"]:
            details["numel"] = int(found["nin"])
        ops = {(m["op"], m["seq"]) for _, m in hits if m.re is _NCCL_TIMEOUT}
        if len({op for op, _ in ops}) > 1:
            details["mismatch"] = sorted(f"{op}#{seq}" for op, seq in ops)
    elif found.re is _BARRIER:
        late = [int(r) for r in found["late"].split(",")]
        details.update(collective="monitored_barrier", timeout_s=int(found["tmo"]) / 1000)
    elif found.re is _GLOO_TIMEOUT:
        details["timeout_s"] = int(found["tmo"]) / 1000
        tb = last_exception(by_rank(lines).get(anchor.rank, []))
        funcs = [f.func for f in tb.frames] if tb else []
        caller = next((label for name, label in _CALLERS if any(name in f for f in funcs)), None)
        details["collective"] = caller or f"a gloo {found['op']}"
    elif found.re is _HEARTBEAT:
        details.update(collective="NCCL watchdog heartbeat", timeout_s=int(found["tmo_s"]))
    else:
        details["collective"] = "a store wait (rendezvous or barrier)"
        if found.groupdict().get("tmo"):
            details["timeout_s"] = int(found["tmo"]) / 1000
    steps = first(of_rank(lines, anchor.rank), _SCRIPT_STEPS)
    if steps is not None:
        rank_steps = {int(r): int(v) for r, v in re.findall(r"rank (\d+): (\d+)", steps[1]["steps"])}
        details["rank_steps"] = {str(r): v for r, v in sorted(rank_steps.items())}
        late = late or [int(r) for r in re.findall(r"rank (\d+) \(", steps[1]["late"] or "")]
        step = step if step is not None else rank_steps.get(anchor.rank) if anchor.rank is not None else None
    if late:
        details["late_ranks"] = late
    evidence = [anchor] + [line for line, _ in hits if line.rank != anchor.rank][:2]
    if steps is not None:
        evidence.insert(1, steps[0])
    collective = details.get("collective", "a collective")
    title = f"a collective timed out on rank {anchor.rank}: {collective}"
    fix = ("The late rank(s) never reached this collective; their last lines show where they were. Usual causes: "
           "one rank stuck or much slower (data loading, a long save or evaluation on one rank only, uneven numbers "
           "of batches), a collective called on some ranks only (inside `if rank == 0:`), or a peer that died. "
           "If the late rank was legitimately busy, raise trainer.timeout_s. With NCCL, "
           "TORCH_NCCL_DUMP_ON_TIMEOUT=1 records what every rank was doing.")
    if "mismatch" in details:
        fix = ("The ranks timed out in different collectives (" + ", ".join(details["mismatch"]) + "): they ran "
               "collectives in a different order or of different kinds. Look for a collective inside a "
               "rank-dependent branch. " + fix)
    return Match("collective_timeout", title, anchor.rank, evidence, fix, cause=False, step=step, details=details)


# ----------------------------------------------------------------------------------------- peer lost
_MGPU_PEER = re.compile(r"lost its connection to another rank")
_PEER = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|NCCL communicator was aborted|"
                   r"Socket unexpectedly closed|recvBytes|sendBytes")


_TORN_DOWN = re.compile(re.escape(TORN_DOWN) + r" with (?P<signal>SIG\w+|signal \d+) after rank (?P<first>\d+) failed")


def torn_down(lines: Sequence[LogLine]) -> Match | None:
    """A rank that the attempt's teardown ended (as the launcher recorded it): an echo, never the cause, whatever
    the signal (the agent's SIGKILL is no out-of-memory kill)."""
    hits = find_all(lines, _TORN_DOWN)
    if not hits:
        return None
    anchor, found = hits[0]
    return Match("torn_down", f"rank {anchor.rank} was {TORN_DOWN} ({found['signal']}) after rank {found['first']} "
                 "failed", anchor.rank, [anchor], "Nothing to fix on this rank: once rank "
                 f"{found['first']} had failed, the job's teardown stopped the others. The cause is on that rank.",
                 cause=False, details={"signal": found["signal"], "after_rank": int(found["first"])})


def peer_lost(lines: Sequence[LogLine]) -> Match | None:
    """A rank that lost its connection to another: an echo. mgpu's own message (which says where) is preferred."""
    hits = find_all(lines, _MGPU_PEER) or find_all(lines, _PEER)
    if not hits:
        return None
    anchor = hits[0][0]
    return Match("peer_lost", f"rank {anchor.rank} lost its connection to another rank", anchor.rank, [anchor],
                 "This rank only saw another rank go away: the cause is on the rank that failed first.",
                 cause=False, details={"ranks": hit_ranks(hits)})


# ----------------------------------------------------------------------------- ranks disagreeing
_DISAGREE = re.compile(
    r"DDP expects same model across all ranks, but Rank (?P<r1>\d+) has (?P<n1>\d+) params, while rank "
    r"(?P<r2>\d+) has inconsistent (?P<n2>\d+) params|"
    r"appears not to match (?:sizes|strides) of the same param in process 0|"
    r"Detected mismatch between collectives on ranks|"
    r"Timed out after (?P<wait>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<world>\d+) clients joined|"
    r"does not match world size|ranks disagree|disagree(?:s)? on the (?:recipe|world size)")


def ranks_disagree(lines: Sequence[LogLine]) -> Match | None:
    hits = find_all(lines, _DISAGREE)
    if not hits:
        return None
    anchor, found = hits[0]
    details: dict[str, Any] = {"ranks": hit_ranks(hits)}
    if found["joined"]:
        details.update(joined=int(found["joined"]), world_size=int(found["world"]))
        title = (f"only {found['joined']} of {found['world']} processes joined the process group "
                 f"within {found['wait']} s")
        fix = ("Every node must be started, with the same --nnodes and the same --nproc/--gpus, so that all ranks "
               "agree on the world size; check that the other nodes' launches started and reached the rendezvous.")
    else:
        title = "the ranks disagree on the model or on the collectives they run"
        fix = ("Every rank must build the same model from the same recipe and code: the same recipe file and "
               f"overrides on every node (compare each node's {LAUNCH_JSON}), the same mgpu and code version, and no "
               "model or collective that depends on the rank. TORCH_DISTRIBUTED_DEBUG=DETAIL reports which "
               "collective differs.")
    return Match("ranks_disagree", title, anchor.rank, [line for line, _ in first_rank_hits(hits)][:3], fix,
                 details=details)


# ------------------------------------------------------------------------------------------ DDP
_UNUSED = re.compile(r"Expected to have finished reduction in the prior iteration before starting a new one")
_UNUSED_STATIC = re.compile(r"not compatible with static_graph set to True")
_UNUSED_IDX = re.compile(r"Parameter indices which did not receive grad for rank (?P<rank>\d+): (?P<idx>[\d ]+)")
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank (?P<rank>\d+): (?P<names>.+)")
_DEBUG_HINT = "Run once with TORCH_DISTRIBUTED_DEBUG=DETAIL to have DDP print the parameters' names."


def ddp_unused_parameters(lines: Sequence[LogLine]) -> Match | None:
    hits = find_all(lines, _UNUSED)
    if not hits:
        return None
    anchor = hits[0][0]
    mine = of_rank(lines, anchor.rank)
    evidence = [anchor]
    details: dict[str, Any] = {"ranks": hit_ranks(hits)}
    names, idx = first(mine, _UNUSED_NAMES), first(mine, _UNUSED_IDX)
    if names:
        evidence.append(names[0])
        details["parameters"] = [n.strip() for n in names[1]["names"].split(",") if n.strip()]
    elif idx:
        evidence.append(idx[0])
        details["parameter_indices"] = [int(i) for i in idx[1]["idx"].split()]
    if first(mine, _UNUSED_STATIC):
        fix = ("trainer.ddp.static_graph=true promises the same parameters take part in every step, but this step "
               "used a different set. Turn static_graph off and set trainer.ddp.find_unused_parameters=true, or "
               f"make every step use the same parameters. {_DEBUG_HINT}")
    else:
        fix = ("Some parameters received no gradient in that step (a branch not taken, a frozen or auxiliary "
               "head, an output not used in the loss). If that is intended, set "
               "trainer.ddp.find_unused_parameters=true; if the same parameters are unused in every step, "
               "trainer.ddp.static_graph=true is cheaper. Otherwise make every forward output feed the loss. "
               + ("" if "parameters" in details else _DEBUG_HINT))
    named = details.get("parameters") or details.get("parameter_indices")
    what = f": {', '.join(str(p) for p in named[:6])}" if named else ""
    return Match("ddp_unused_parameters", f"DDP: parameters without a gradient on rank {anchor.rank}{what}",
                 anchor.rank, evidence, fix.strip(), details=details)


_TWICE = re.compile(r"Expected to mark a variable ready only once")
_TWICE_PARAM = re.compile(r"Parameter at index (?P<idx>\d+)(?: with name (?P<name>\S+))? "
                          r"has been marked as ready twice")


def ddp_ready_twice(lines: Sequence[LogLine]) -> Match | None:
    hits = find_all(lines, _TWICE)
    if not hits:
        return None
    anchor = hits[0][0]
    mine = of_rank(lines, anchor.rank)
    evidence, details = [anchor], {"ranks": hit_ranks(hits)}
    param = first(mine, _TWICE_PARAM)
    if param:
        evidence.append(param[0])
        details["parameter_index"] = int(param[1]["idx"])
        if param[1]["name"]:
            details["parameter"] = param[1]["name"]
    fix = ("A parameter received two gradients in one backward pass: reentrant activation checkpointing "
           "(use torch.utils.checkpoint.checkpoint(..., use_reentrant=False)), or a module used twice in one "
           "step. If the model's graph is the same in every step, trainer.ddp.static_graph=true allows it; if "
           "trainer.ddp.find_unused_parameters=true is set but every parameter is used, set it to false."
           + ("" if "parameter" in details else f" {_DEBUG_HINT}"))
    name = details.get("parameter") or (f"index {details['parameter_index']}" if param else None)
    what = f" ({name})" if name else ""
    return Match("ddp_ready_twice", f"DDP: a parameter was marked ready twice on rank {anchor.rank}{what}",
                 anchor.rank, evidence, fix, details=details)
