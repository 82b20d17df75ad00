"""The fake tracker's sink on rank 0: one JSON line per record in RUN_DIR/<folder>/pages.jsonl."""

from __future__ import annotations

import json

from mgpucli.engine.tracking import Started


class NotebookSink:
    title = "Notebook"

    def start(self, ctx):
        self.pages = ctx.run_dir / ctx.options["folder"] / "pages.jsonl"
        self.pages.parent.mkdir(parents=True, exist_ok=True)
        return Started({"pages": str(self.pages)}, message=f"Notebook: run {ctx.run_id}, pages in {self.pages}")

    def log(self, step, metrics, wall_time):
        with open(self.pages, "a") as fh:
            fh.write(json.dumps({"step": step, **metrics}) + "\n")

    def finish(self, status, checkpoints):
        pass


def make():
    return NotebookSink()
