"""An elastic job's node range (``--nnodes MIN:MAX``, ``PET_NNODES=MIN:MAX``) and the global batch it keeps on every
node count of the range (pure, stdlib only).

torchrun takes ``--nnodes MIN:MAX``: the job starts once MIN nodes have met (up to MAX), and the agent restarts the
worker group on the nodes still there when one is lost, and when one more comes. mgpu adds what a recipe needs for
that: the global batch is defined once, as the recipe's at MAX nodes (processes x ``data.batch_size`` x
``trainer.grad_accum`` with every node there), and every node count of the range must keep it with a whole
``trainer.grad_accum`` (:func:`check_global_batch`: refused with exit 2 at launch, naming the counts that cannot and
the settings that would). A run resumed from a checkpoint keeps the checkpoint's global batch instead, by the same
rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mgpucli.errors import UsageError


@dataclass(frozen=True)
class NodeRange:
    """How many nodes a job runs on: ``low == high`` for a fixed count, ``low < high`` for an elastic job."""

    low: int
    high: int

    @property
    def elastic(self) -> bool:
        return self.low < self.high

    def __str__(self) -> str:
        return f"{self.low}:{self.high}" if self.elastic else str(self.high)

    def counts(self) -> range:
        return range(self.low, self.high + 1)


def parse_nnodes(text: str, source: str = "--nnodes") -> NodeRange:
    """``N`` or torchrun's ``MIN:MAX`` (``source``: how the user gave it, for the message); UsageError otherwise."""
    low, sep, high = text.strip().partition(":")
    given = f"{source}{text}" if source.endswith("=") else f"{source} {text}"
    try:
        found = NodeRange(int(low), int(high)) if sep else NodeRange(int(low), int(low))
    except ValueError:
        raise UsageError(f"{given}: give a node count (2) or an elastic range MIN:MAX (1:4).",
                         "Example: --nnodes 2, or --nnodes 1:4 for a job that goes on with 1 to 4 nodes.") from None
    if found.low < 1:
        raise UsageError(f"{given}: must be at least 1.", "Example: --nnodes 2 (or 1:4).")
    if found.high < found.low:
        raise UsageError(f"{given}: MAX is below MIN.", f"Write it MIN:MAX, e.g. {found.high}:{found.low}.")
    return found


def global_batch_at_max(nodes: NodeRange, nproc: int, batch_size: int, grad_accum: int) -> int:
    """The global batch an elastic job keeps: the recipe's with every node of the range there."""
    return nodes.high * nproc * batch_size * grad_accum


def grad_accum_on(nodes: int, nproc: int, batch_size: int, global_batch: int) -> int | None:
    """The whole ``trainer.grad_accum`` that keeps ``global_batch`` on ``nodes`` x ``nproc`` processes x
    ``batch_size`` (None: no whole one does)."""
    per_step = nodes * nproc * batch_size
    return global_batch // per_step if global_batch % per_step == 0 else None


def check_global_batch(nodes: NodeRange, nproc: int, batch_size: int, global_batch: int, whose: str) -> None:
    """UsageError (exit 2) unless every node count of ``nodes`` keeps ``global_batch`` with a whole grad_accum; it
    names the counts that cannot and the settings that would. ``whose``: where the global batch comes from."""
    failing = [n for n in nodes.counts() if grad_accum_on(n, nproc, batch_size, global_batch) is None]
    if not failing:
        return
    counts = ", ".join(f"{n} node(s) ({global_batch} / ({n} x {nproc} x {batch_size}) = "
                       f"{global_batch / (n * nproc * batch_size):g})" for n in failing)
    raise UsageError(
        f"--nnodes {nodes}: the global batch {global_batch} ({whose}) cannot be kept with a whole trainer.grad_accum "
        f"on {counts}.", _fixes(nodes, nproc, batch_size, global_batch))


def _fixes(nodes: NodeRange, nproc: int, batch_size: int, global_batch: int) -> str:
    """Settings that keep every count of the range: the same global batch split otherwise, another global batch, or
    another range."""
    per_process_at_max = global_batch // (nodes.high * nproc)
    # grad_accum at MAX nodes must be a multiple of this for every count to divide MAX x grad_accum
    step = _lcm(nodes.counts()) // math.gcd(_lcm(nodes.counts()), nodes.high)
    pairs = [f"data.batch_size={per_process_at_max // a} trainer.grad_accum={a}"
             for a in range(step, per_process_at_max + 1, step) if per_process_at_max % a == 0][:3]
    lines = []
    if pairs and global_batch % (nodes.high * nproc) == 0:
        lines.append(f"Keep the global batch {global_batch} with: " + "; or ".join(pairs) + ".")
    accum = global_batch // (nodes.high * nproc * batch_size) if global_batch % (nodes.high * nproc * batch_size) == 0 \
        else 1
    wider = accum * step // math.gcd(accum, step)
    lines.append(f"Or another global batch, {nodes.high * nproc * batch_size * wider}: data.batch_size={batch_size} "
                 f"trainer.grad_accum={wider}.")
    keeping = [n for n in nodes.counts() if grad_accum_on(n, nproc, batch_size, global_batch) is not None]
    if len(keeping) > 1:
        counts = ", ".join(map(str, keeping))
        lines.append(f"Or a narrower range: of {nodes.low} to {nodes.high} nodes, {counts} keep it.")
    return "\n".join(lines)


def _lcm(values: range) -> int:
    out = 1
    for value in values:
        out = out * value // math.gcd(out, value)
    return out


def layout_line(nodes: NodeRange, nproc: int, batch_size: int, global_batch: int) -> str:
    """What an elastic job says at its start: the global batch and how every count of the range keeps it."""
    parts = []
    for n in nodes.counts():
        accum = grad_accum_on(n, nproc, batch_size, global_batch)
        parts.append(f"{n} node(s): {n * nproc} x {batch_size} x grad_accum {accum}")
    return (f"elastic job of {nodes.low} to {nodes.high} nodes: global batch {global_batch} (the recipe's on "
            f"{nodes.high} nodes), kept on every count: {'; '.join(parts)}.")
