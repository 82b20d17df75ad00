"""Every trial's recipe composed and checked before any trial starts: all problems at once, each naming its trial's
values (exit 2, nothing written). The check is ``mgpu launch``'s own: the schema, every ``_target_`` and tracker, and
the optimizer, scheduler, task and model built on the meta device."""

from __future__ import annotations

from dataclasses import dataclass

from mgpucli.errors import MgpuError, RecipeError, UsageError
from mgpucli.sweep.grid import Grid


@dataclass(frozen=True)
class Compared:
    """The validation metric the sweep compares trials by, and which way is better."""

    metric: str
    mode: str  # "min" or "max"


def check_trials(recipe: str, grid: Grid, device_overrides: list[str], metric: str | None,
                 label: str = "trial") -> Compared:
    """Check every trial's recipe as its workers will get it; returns the metric trials are compared by (``metric``,
    else the recipe's ``trainer.best_metric``, else ``loss``). One UsageError lists every trial's problems, each named
    ``label N (its values)`` (a search checks its bounds and categories: ``values``)."""
    from omegaconf import OmegaConf

    from mgpucli.config import check_recipe, load_recipe
    from mgpucli.config.components import check_builds
    from mgpucli.engine.run import ensure_cwd_on_path
    from mgpucli.metric_mode import resolve_mode

    ensure_cwd_on_path()  # a recipe's own components in this directory, as a run finds them
    problems: list[str] = []
    compared: Compared | None = None
    for trial in grid.trials:
        extra = [f"trainer.best_metric={metric}"] if metric else []  # --metric checked as the recipe's would be
        try:
            cfg = load_recipe(recipe, [*grid.common, *trial.overrides, *device_overrides, *extra])
            check_recipe(cfg, recipe, trackers="import")
            check_builds(cfg, recipe)
        except RecipeError as err:
            problems += [f"{label} {trial.index} ({trial.describe()}): {_named(p, metric)}" for p in err.problems]
            continue
        except MgpuError as err:
            problems.append(f"{label} {trial.index} ({trial.describe()}): {err.message}")
            continue
        if compared is None:
            name = metric or OmegaConf.select(cfg, "trainer.best_metric", default=None) or "loss"
            mode = "auto" if metric else str(cfg.trainer.best_mode)  # the recipe's mode is its best_metric's
            compared = Compared(str(name), resolve_mode(str(name), mode))
    if problems:
        raise UsageError(f"{len(problems)} problem(s) in the sweep's trials of recipe {recipe}:\n"
                         + "\n".join(f"  - {p}" for p in problems),
                         "Fix the values above (or the recipe); nothing was started or written.")
    assert compared is not None  # every trial checked without a problem
    return compared


def _named(problem: str, metric: str | None) -> str:
    """A problem with the --metric given, said as the option's (the check saw it as trainer.best_metric)."""
    if metric and problem.startswith("trainer.best_metric:"):
        return "--metric" + problem.removeprefix("trainer.best_metric")
    return problem
