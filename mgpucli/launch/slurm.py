"""What a SLURM allocation says about the job's nodes (pure: the environment is passed in).

Inside an allocation, ``mgpu launch`` runs once per node (``srun --ntasks-per-node=1 mgpu launch ...``) and
takes the node count, this node's rank and the master address (the first host of the allocation) from the
``SLURM_*`` variables wherever the user did not give them. Every node must reach the same answers without
talking to the others, so the rendezvous port and id are derived from the job id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mgpucli.errors import UsageError

# Ports 10000..29999: above the well-known and registered-by-habit ranges, below Linux's ephemeral range
# (32768..60999), so the OS never hands the port to an outgoing connection.
_PORT_BASE = 10000
_PORT_SPAN = 20000


@dataclass(frozen=True)
class SlurmInfo:
    """The parts of a SLURM allocation that decide how the nodes rendezvous."""

    job_id: str
    nnodes: int
    node_rank: int | None  # None when this node is not found in the node list
    hosts: tuple[str, ...]
    step_id: str | None = None

    @property
    def master_addr(self) -> str:
        return self.hosts[0]

    @property
    def master_port(self) -> int:
        return default_port_for_job(self.job_id)

    @property
    def rdzv_id(self) -> str:
        return f"slurm-{self.job_id}" + (f".{self.step_id}" if self.step_id else "")


def default_port_for_job(job_id: str) -> int:
    """A port every node of the job computes alike (the same job id gives the same port)."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return _PORT_BASE + int(digits) % _PORT_SPAN


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError("unbalanced '['")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_range_list(body: str) -> list[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']`` (zero padding kept, as SLURM does)."""
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise ValueError("empty range item")
        if "-" in item:
            lo, hi = item.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {item!r}")
            width = len(lo)
            out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        elif item.isdigit():
            out.append(item)
        else:
            raise ValueError(f"bad range item {item!r}")
    return out


def _expand_one(pattern: str) -> list[str]:
    """Expand one host pattern; several bracket groups multiply: ``r[1-2]n[1-2]`` -> 4 hosts."""
    match = re.search(r"\[([^\[\]]*)\]", pattern)
    if match is None:
        if "[" in pattern or "]" in pattern:
            raise ValueError("unbalanced brackets")
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [head + mid + rest for mid in _expand_range_list(match.group(1)) for rest in _expand_one(tail)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM hostlist such as ``node[01-03,07],gpu5`` into host names, in order."""
    try:
        hosts = [h for part in _split_top_level(nodelist) for h in _expand_one(part)]
    except ValueError as err:
        raise UsageError(
            f"Cannot read the SLURM node list {nodelist!r}: {err}.",
            "Pass the master address yourself: --master-addr HOST (the first node of the job).",
        ) from None
    if not hosts:
        raise UsageError(f"The SLURM node list {nodelist!r} names no host.", "Pass --master-addr HOST.")
    return hosts


def _first(environ: Mapping[str, str], *keys: str) -> str | None:
    for key in keys:
        value = environ.get(key)
        if value:
            return value
    return None


def read_slurm(environ: Mapping[str, str]) -> SlurmInfo | None:
    """The allocation this process runs in, or None outside SLURM.

    Inside an ``srun`` step the step's own variables win (a step may use fewer nodes than the job).
    This node's rank is its position in the node list (``SLURMD_NODENAME``), else ``SLURM_NODEID``.
    """
    job_id = _first(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    if job_id is None:
        return None
    nodelist = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    count = _first(environ, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    hosts = tuple(expand_nodelist(nodelist)) if nodelist else ()
    if count is not None:
        try:
            nnodes = int(count)
        except ValueError:
            raise UsageError(f"SLURM node count {count!r} is not an integer.", "Pass --nnodes N.") from None
    else:
        nnodes = len(hosts) or 1
    if hosts and len(hosts) != nnodes:
        hosts = hosts[:nnodes] if len(hosts) > nnodes else hosts
    node_rank: int | None = None
    name = environ.get("SLURMD_NODENAME")
    if name and name in hosts:
        node_rank = hosts.index(name)
    else:
        raw = environ.get("SLURM_NODEID")
        if raw is not None and raw.isdigit():
            node_rank = int(raw)
    step_id = _first(environ, "SLURM_STEP_ID", "SLURM_STEPID")
    return SlurmInfo(job_id=job_id, nnodes=nnodes, node_rank=node_rank, hosts=hosts, step_id=step_id)
