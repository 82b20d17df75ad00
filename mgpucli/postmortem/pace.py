"""The run's pace from its records: the rank the others waited for, and why (``metrics.jsonl``'s step anatomy)."""

from __future__ import annotations

from typing import Any

from mgpucli.postmortem.reader import RunRecord
from mgpucli.run_records import step_anatomy


def straggler_of(run: RunRecord) -> dict[str, Any] | None:
    """The straggler found in the run's train records (its rank, cause, shares and the one-line summary with the
    fix in the recipe's terms), or None."""
    found = step_anatomy.find_straggler([m for m in run.metrics if m.get("split") == "train"])
    if found is None:
        return None
    knobs = {"num_workers": run.recipe_value("data.num_workers"), "pin_memory": run.recipe_value("data.pin_memory"),
             "device": run.recipe_value("trainer.device")} if not run.is_script else {}
    return {**found.as_dict(), "summary": step_anatomy.summary(found, **knobs)}
