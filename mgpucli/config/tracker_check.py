"""Is every tracker ``trainer.loggers`` names usable here? Checked with the recipe, before any worker starts.

Every path that starts a run meets this check first: ``mgpu launch`` (in the launcher, once), ``--check``, and
``mgpu train`` composing its own recipe (alone or under plain torchrun). The launcher and ``--check`` import the
tracker (a broken install shows only then); a worker composing its own recipe only looks it up, so that ranks other
than 0 never import a tracker and every rank reaches the same verdict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from mgpucli import trackers

KEY = "trainer.loggers"


def tracker_problems(cfg: DictConfig, importing: bool, environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per tracker that cannot run here, each naming the key and the pip command that fixes it; then what
    the tracker's own check finds (:attr:`mgpucli.trackers.Spec.check`)."""
    trainer = cfg.trainer
    loggers = OmegaConf.to_container(trainer.loggers) if trainer.get("loggers") is not None else []
    env = os.environ if environ is None else environ
    problems = []
    for name in trackers.trackers_in(trackers.enabled(loggers, trainer.get("tensorboard"))):
        spec = trackers.SPECS[name]
        problem = trackers.module_problem(spec.module, importing)
        if problem is not None:
            fix = "reinstall it" if "does not import" in problem else "install it"
            problems.append(f"{KEY}: {name}: {problem}; {fix} with {spec.pip}, or drop {name} from {KEY}")
            continue
        if spec.check is not None:
            options = OmegaConf.to_container(trainer[name], resolve=True) if trainer.get(name) is not None else {}
            problems += [f"{KEY}: {line}" for line in spec.check(options, str(cfg.run_dir), env, importing)]
    return problems
