"""Weights & Biases, on rank 0's tracking thread (imported there, and only there).

The mode comes from :func:`mgpucli.trackers.wandb_mode`: online only where credentials exist, so W&B never asks for
a key (a prompt would hang a job). Files go to ``RUN_DIR/wandb``; an offline run is uploaded later with
``wandb sync``. The run id is mgpu's (chosen before the run starts, kept in trackers.json and checkpoints), and a
resumed run continues it (``resume="allow"``: offline, W&B writes a second directory with the same id, and
``wandb sync`` uploads both as one run). Steps are mgpu's optimizer steps. W&B's own console capture is off: every
rank's output is already in the run's logs.
"""

from __future__ import annotations

from typing import Any

from mgpucli import trackers
from mgpucli.engine.tracking import EXIT_CODES, Context, Started
from mgpucli.run_layout import WANDB


class WandbSink:
    title = "W&B"

    def __init__(self) -> None:
        self.run: Any = None

    def start(self, ctx: Context) -> Started:
        import wandb

        opts = ctx.options
        decided = trackers.wandb_mode(str(opts.get("mode") or "auto"), ctx.environ)
        project = opts.get("project") or ctx.name
        self.run = wandb.init(
            project=project, entity=opts.get("entity"), name=opts.get("name") or ctx.run_dir.name,
            tags=[f"{k}:{v}" for k, v in ctx.tags.items()] + [str(t) for t in opts.get("tags") or []],
            config=ctx.recipe, id=ctx.run_id, resume="allow", dir=str(ctx.run_dir), mode=decided.mode,
            allow_val_change=True,  # a resumed run may change a setting (the launcher warns about it)
            settings=wandb.Settings(console="off", silent=True),
        )
        wandb_dir = ctx.run_dir / WANDB
        entry = {"id": ctx.run_id, "mode": decided.mode, "project": project, "entity": opts.get("entity"),
                 "dir": str(wandb_dir)}
        again = "continuing run" if ctx.continuing else "run"
        if decided.mode == "offline":
            entry["sync"] = trackers.wandb_sync_command(wandb_dir, ctx.run_id)
            text = f"W&B: offline {again} {ctx.run_id} ({decided.why}); upload it with: {entry['sync']}"
            return Started(entry, warn=text) if decided.asked_online_without_credentials else Started(entry, text)
        if decided.mode == "online":
            entry["url"] = getattr(self.run, "url", None)
            return Started(entry, f"W&B: {again} {entry['url'] or ctx.run_id} ({decided.why})")
        return Started(entry, f"W&B: disabled ({decided.why}); nothing is logged to it")

    def log(self, step: int, metrics: dict[str, float], wall_time: float) -> None:
        self.run.log(metrics, step=step)

    def finish(self, status: str, checkpoints: dict[str, str]) -> None:
        run, self.run = self.run, None
        run.summary.update({f"checkpoint/{what}": path for what, path in checkpoints.items()})
        run.summary["mgpu/status"] = status
        if status == "preempted":
            run.mark_preempting()
        run.finish(exit_code=EXIT_CODES.get(status, 1))


def make() -> WandbSink:
    return WandbSink()
