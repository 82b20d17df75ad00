"""A run's batch layout (processes x per-process batch x ``trainer.grad_accum``) and its segments: the stretches
of a run trained on one layout, recorded in every checkpoint. Stdlib only: the engine, the launcher and
``mgpu doctor RUN_DIR`` (which never imports torch) read them.

On a resume the checkpoint's global batch is kept (:func:`keep_global_batch`): on another process count
``trainer.grad_accum`` changes so that processes x batch x grad_accum stays what it was, and a resume that no
whole ``grad_accum`` fits is refused with the layouts that would. ``data.batch_size`` or ``trainer.grad_accum``
given on the command line wins, with a warning that the global batch changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mgpucli import env_vars
from mgpucli.errors import UsageError

PINNED_KEYS = ("data.batch_size", "trainer.grad_accum")  # what a command-line override keeps as given


@dataclass(frozen=True)
class Layout:
    world_size: int  # processes
    batch_size: int  # per process, per micro-step (data.batch_size)
    grad_accum: int  # micro-steps per optimizer step (trainer.grad_accum)

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size * self.grad_accum

    def __str__(self) -> str:
        return f"{self.world_size} process(es) x {self.batch_size} x grad_accum {self.grad_accum}"


@dataclass(frozen=True)
class Segment:
    """A stretch of the run trained on one layout, from optimizer step ``first_step`` (counted from 1); ``nodes``:
    on how many nodes, recorded for a job of several nodes or an elastic one (None: not recorded, one node)."""

    first_step: int
    layout: Layout
    nodes: int | None = None

    def record(self) -> dict[str, int]:
        """The checkpoint's plain-ints form (loads with ``weights_only=True`` and without torch)."""
        layout = self.layout
        return {"first_step": self.first_step, "world_size": layout.world_size, "batch_size": layout.batch_size,
                "grad_accum": layout.grad_accum, **({"nodes": self.nodes} if self.nodes is not None else {})}

    def where(self) -> str:
        """``2 process(es)``, or where nodes are recorded ``2 nodes x 1 process(es)``."""
        if self.nodes is None:
            return f"{self.layout.world_size} process(es)"
        per_node = self.layout.world_size // self.nodes if self.nodes else self.layout.world_size
        return f"{self.nodes} node{'s' if self.nodes != 1 else ''} x {per_node} process(es)"


def segments_of(payload: dict[str, Any]) -> list[Segment]:
    """The segments a checkpoint's payload records (none for a checkpoint written before they were)."""
    found = []
    for item in payload.get("segments") or ():
        values = [item.get(k) if isinstance(item, dict) else None
                  for k in ("first_step", "world_size", "batch_size", "grad_accum")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            return []
        nodes = item.get("nodes")
        found.append(Segment(values[0], Layout(*values[1:]), nodes if isinstance(nodes, int) and nodes > 0 else None))
    return found


def continued(segments: list[Segment], step: int, layout: Layout, nodes: int | None = None) -> list[Segment]:
    """The segments after a (re)start at ``step`` on ``layout`` (and ``nodes``): a new one unless they are the last
    one's."""
    if segments and segments[-1].layout == layout and segments[-1].nodes == nodes:
        return list(segments)
    return [*segments, Segment(step + 1, layout, nodes)]


def describe(segments: list[Segment], last_step: int) -> str:
    """``steps 1-100 on 2 process(es) (2 x 32 x grad_accum 1), steps 101-192 on 1 process(es) (...)``."""
    parts = []
    for i, seg in enumerate(segments):
        end = segments[i + 1].first_step - 1 if i + 1 < len(segments) else last_step
        steps = (f"from step {seg.first_step}" if end < seg.first_step else f"step {end}" if end == seg.first_step
                 else f"steps {seg.first_step}-{end}")
        parts.append(f"{steps} on {seg.where()} (global batch {seg.layout.global_batch} = "
                     f"{seg.layout.world_size} x {seg.layout.batch_size} x grad_accum {seg.layout.grad_accum})")
    return ", ".join(parts)


def elastic_global_batch(environ: Mapping[str, str]) -> int | None:
    """The global batch an elastic job keeps on every node count (``mgpu launch --nnodes MIN:MAX`` sets it for a
    recipe's workers, :mod:`mgpucli.launch.elastic_plan`); None: not an elastic job."""
    raw = environ.get(env_vars.ELASTIC_GLOBAL_BATCH, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def elastic_start(global_batch: int, world_size: int, batch_size: int, grad_accum: int) -> Resolution:
    """The layout an elastic job's fresh start trains on: ``global_batch`` (the recipe's at MAX nodes) on the processes
    there, ``trainer.grad_accum`` changed to keep it; UsageError when no whole one does (the launch checked it)."""
    if global_batch % (world_size * batch_size):
        raise UsageError(f"the elastic job's global batch {global_batch} cannot be kept on {world_size} process(es) "
                         f"with data.batch_size={batch_size}.", _options(global_batch, world_size, batch_size))
    layout = Layout(world_size, batch_size, global_batch // (world_size * batch_size))
    if layout.grad_accum == grad_accum:
        return Resolution(layout)
    return Resolution(layout, note=f"elastic job: keeping its global batch {global_batch} on {world_size} "
                                   f"process(es): {layout} (trainer.grad_accum={layout.grad_accum}).")


def pinned_by(overrides: Iterable[str]) -> frozenset[str]:
    """Which of :data:`PINNED_KEYS` the command-line overrides set (``key=v``, ``+key=v``, ``++key=v``)."""
    keys = {item.split("=", 1)[0].lstrip("+~") for item in overrides if "=" in item}
    return frozenset(k for k in PINNED_KEYS if k in keys)


@dataclass(frozen=True)
class Resolution:
    """The layout a resume trains on, and what to tell the user about it (None: nothing changed)."""

    layout: Layout
    note: str | None = None  # the global batch kept with another grad_accum
    warning: str | None = None  # the global batch changed by an override


def keep_global_batch(saved: Layout, world_size: int, batch_size: int, grad_accum: int,
                      pinned: frozenset[str]) -> Resolution:
    """The layout a resume on ``world_size`` processes trains on: the checkpoint's global batch with the recipe's
    ``batch_size`` and a ``grad_accum`` that keeps it, or, with ``data.batch_size``/``trainer.grad_accum`` given on
    the command line (``pinned``), the recipe's values as they are. UsageError when no whole grad_accum fits."""
    if pinned:
        layout = Layout(world_size, batch_size, grad_accum)
        if layout.global_batch == saved.global_batch:
            return Resolution(layout)
        return Resolution(layout, warning=(
            f"the global batch changes from {saved.global_batch} ({saved}) to {layout.global_batch} ({layout}, "
            f"x{layout.global_batch / saved.global_batch:g}) because {' and '.join(sorted(pinned))} is set on the "
            "command line: this is another optimization than the checkpoint's (the learning rate and its schedule "
            "are as they were, in optimizer steps). To keep the global batch, resume without them on the command "
            "line."))
    per_step = batch_size * world_size
    if saved.global_batch % per_step:
        raise UsageError(
            f"the checkpoint was trained with a global batch of {saved.global_batch} ({saved}); on {world_size} "
            f"process(es) with data.batch_size={batch_size} no whole trainer.grad_accum keeps it "
            f"({saved.global_batch} / ({world_size} x {batch_size}) = {saved.global_batch / per_step:g}).",
            _options(saved.global_batch, world_size, batch_size))
    layout = Layout(world_size, batch_size, saved.global_batch // per_step)
    if layout == saved:
        return Resolution(layout)
    return Resolution(layout, note=(
        f"keeping the checkpoint's global batch {saved.global_batch}: {saved} then, {layout} now "
        f"(trainer.grad_accum={layout.grad_accum})."))


def _options(global_batch: int, world_size: int, batch_size: int) -> str:
    """The layouts that keep ``global_batch``: per-process batch and grad_accum on this process count, or other
    process counts with this batch; and the override that accepts another global batch."""
    per_process = global_batch // world_size if global_batch % world_size == 0 else None
    pairs = [f"data.batch_size={per_process // a} trainer.grad_accum={a}"
             for a in range(1, (per_process or 0) + 1) if per_process and per_process % a == 0][:4]
    counts = [n for n in range(1, global_batch // batch_size + 1)
              if global_batch % (n * batch_size) == 0 and n != world_size][:6]
    lines = []
    if pairs:
        lines.append(f"On {world_size} process(es), keep it with: " + "; or ".join(pairs) + ".")
    if counts:
        lines.append(f"With data.batch_size={batch_size}, run on {' or '.join(map(str, counts))} process(es).")
    lines.append("Or accept another global batch: set data.batch_size or trainer.grad_accum on the command line.")
    return "\n".join(lines)
