"""The deep recipe check behind ``mgpu train/launch RECIPE --check``: does my config even load?

Everything a run checks before its first step, and nothing that costs a device or writes a file: compose
with the overrides, the schema, every ``_target_`` (imports, callable, arguments bind), then the datasets
(``data.train`` and ``data.val`` are built and their first sample read, since a dataset is where a new recipe
most often breaks). The model, the optimizer and the process group are not built: signatures cover them, and
building a large model is what ``--check`` exists to avoid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mgpucli.config import check_recipe, load_recipe
from mgpucli.config.components import check_builds, fit_problems, kind_problem, problem
from mgpucli.config.targets import TOP_COMPONENTS, build, iter_targets
from mgpucli.errors import RecipeError

DATASETS = ("train", "val")


@dataclass(frozen=True)
class DatasetFacts:
    path: str  # data.train / data.val
    target: str
    size: int | None  # None: an iterable dataset without a length
    sample: str  # a short description of the first sample ("" if it has none)


@dataclass
class CheckResult:
    source: str  # what the user passed: a path or a shipped name
    file: Path  # the recipe file it resolved to
    shipped: bool
    cfg: DictConfig
    targets: int
    datasets: list[DatasetFacts] = field(default_factory=list)

    def resolved_yaml(self) -> str:
        return OmegaConf.to_yaml(self.cfg, resolve=True)


def describe_sample(value: Any, depth: int = 0) -> str:
    """``(float32[32], int64[])`` for a tuple of tensors; nested containers and plain values too."""
    if depth > 3:
        return "..."
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # a tensor or an array, without importing torch
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}[{', '.join(str(d) for d in tuple(value.shape))}]"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe_sample(v, depth + 1) for v in value[:8])
        more = ", ..." if len(value) > 8 else ""
        return f"({inner}{more})" if isinstance(value, tuple) else f"[{inner}{more}]"
    if isinstance(value, dict):
        items = list(value.items())[:8]
        return "{" + ", ".join(f"{k}: {describe_sample(v, depth + 1)}" for k, v in items) + "}"
    return type(value).__name__


def build_dataset(path: str, node: DictConfig) -> tuple[DatasetFacts | None, Any, str | None]:
    """Build one dataset and read its first sample; (facts, the dataset, None) or (None, None, the problem)."""
    target = str(node.get("_target_"))
    try:
        dataset = build(node)
    except Exception as err:  # the user's (or a library's) dataset code: report it as a recipe problem
        return None, None, problem(path, target, "building", err)
    wrong = kind_problem(path, node, dataset)
    if wrong:
        return None, None, wrong
    try:
        size = len(dataset)
    except TypeError:  # an IterableDataset without __len__
        size = None
    if size == 0:
        return None, None, f"{path}: {target} is empty (0 samples)"
    try:
        first = dataset[0] if size is not None else next(iter(dataset))
    except Exception as err:
        return None, None, problem(path, target, "reading the first sample of", err)
    return DatasetFacts(path, target, size, describe_sample(first)), dataset, None


def count_targets(cfg: DictConfig) -> int:
    container = OmegaConf.to_container(cfg, resolve=True)
    total = 0
    for top in TOP_COMPONENTS:
        section, _, key = top.rpartition(".")
        node = container.get(section, {}).get(key) if section else container.get(key)
        total += sum(1 for _ in iter_targets(node, top))
    return total


def check_deep(recipe: str, overrides: list[str], trackers: str = "import") -> CheckResult:
    """Check a recipe as a run would, without training; one RecipeError lists every problem found.

    The caller puts the working directory on ``sys.path`` first (as a run does) for user components. The experiment
    trackers the recipe names are imported (``trackers="find"``: only looked up, for a job's ranks other than 0).
    """
    from mgpucli.recipes import resolve

    file = resolve(recipe)
    cfg = load_recipe(recipe, overrides)
    check_recipe(cfg, recipe, trackers=trackers)
    model = check_builds(cfg, recipe)  # the optimizer, the scheduler, the task, the model (on the meta device)
    facts, problems, built = [], [], {}
    for split in DATASETS:
        node = cfg.data.get(split)
        if node is None:
            continue
        fact, dataset, problem = build_dataset(f"data.{split}", node)
        if fact is not None:
            facts.append(fact)
            built[fact.path] = dataset
        if problem is not None:
            problems.append(problem)
    if model is not None:
        problems += fit_problems(built, model)
    if problems:
        raise RecipeError(recipe, problems, "The recipe loads and its _target_s fit; building the dataset failed. "
                          "Fix the dataset arguments (or the dataset's code) and run --check again.")
    return CheckResult(source=recipe, file=file, shipped=not Path(recipe).is_file(), cfg=cfg,
                       targets=count_targets(cfg), datasets=facts)
