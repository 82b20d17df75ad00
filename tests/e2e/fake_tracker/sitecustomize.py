"""A tracker mgpu does not ship, registered through mgpucli.trackers alone: on PYTHONPATH, so that every process of
a test (the CLI, the launcher, every worker) registers it at start. Used by tests/e2e/test_tracker_registry.py."""

from __future__ import annotations

from dataclasses import dataclass

from mgpucli import trackers


@dataclass
class NotebookOptions:
    folder: str = "notebook"  # under the run dir
    style: str = "plain"


def observe(environ):
    if environ.get("NOTEBOOK_SHELF"):
        return trackers.Observed(environ["NOTEBOOK_SHELF"], "NOTEBOOK_SHELF")
    return trackers.Observed("RUN_DIR/notebook", "the default", "no NOTEBOOK_SHELF: pages stay in each run dir")


trackers.register(trackers.Spec(
    "notebook", "Notebook", "notebook_tracker", ("notebook-tracker",), sink="notebook_sink",
    options=NotebookOptions, observe=observe, shows=lambda seen: f"pages go to {seen.mode} ({seen.why})",
    fix="export NOTEBOOK_SHELF=/shelf", where=("pages",), choices={"style": ("plain", "fancy")},
    new_run_id=lambda: "nb-0001",
))
