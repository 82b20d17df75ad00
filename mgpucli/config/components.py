"""Building a recipe's components, with any failure reported as a problem in the recipe (exit 2), not a crash.

A component is a ``_target_`` node: ``model``, ``data.train``, ``data.val``, ``optim``, ``scheduler``, a custom
``task``, or anything nested in them. Whatever its constructor raises (a wrong type from an override typo, a file
a dataset can't find, a bug in the user's module) is reported with the recipe key, the ``_target_``, the exception
and where it was raised; ``MGPU_DEBUG=1`` adds the whole traceback. mgpu's own errors pass through unchanged.

:func:`check_builds` is what the launcher (before any worker starts) and ``--check`` run: the optimizer and the
scheduler on a stand-in parameter, the task, and the model on the ``meta`` device (no memory for its weights).
Datasets may be large or need a device: the launcher leaves them to the workers (``--check`` builds them).
"""

from __future__ import annotations

import os
import traceback
from typing import Any

from omegaconf import DictConfig

from mgpucli.config.schema import TASK_METRICS
from mgpucli.config.targets import build
from mgpucli.errors import MgpuError, RecipeError, UsageError
from mgpucli.model_facts import blocks_to_checkpoint, loss_problem, metric_names, select_blocks

DEBUG_ENV = "MGPU_DEBUG"


def original(err: BaseException) -> BaseException:
    """The user's exception, not Hydra's wrapper around it ("Error in call to target ...")."""
    from hydra.errors import InstantiationException

    while isinstance(err, InstantiationException) and err.__cause__ is not None:
        err = err.__cause__
    return err


def problem(path: str, target: str, what: str, err: BaseException, node: DictConfig | dict | None = None) -> str:
    """``data.train: building pkg.Set failed: OSError: no such file (raised at pkg.py:12)``; when the constructor
    raised on a value of the wrong type that ``node``'s arguments tell (:func:`wrong_type`), that argument first:
    ``optim: building torch.optim.SGD failed: optim.lr='abc' is a string; SGD needs a number (TypeError: ...)``.
    A component's own UsageError is its message under ``path``: ``data.train: the text column ...``."""
    err = original(err)
    if isinstance(err, UsageError) and not isinstance(err, RecipeError):
        return f"{path}: {err.message}"
    reason = " ".join(str(err).split()) or type(err).__name__
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    wrong = wrong_type(path, target, node) if node is not None and isinstance(err, TypeError | ValueError) else None
    if wrong:
        text = f"{path}: {what} {target} failed: {wrong} ({type(err).__name__}: {reason})"
    else:
        text = f"{path}: {what} {target} failed: {type(err).__name__}: {reason}{where}"
    if os.environ.get(DEBUG_ENV) == "1":
        text += "\n" + "".join(traceback.format_exception(err)).rstrip()
    return text


def wrong_type(path: str, target: str, node: DictConfig | dict) -> str | None:
    """``optim.lr='abc' is a string; SGD needs a number``: the first argument given as text where the target's own
    default is a number (or true/false), the usual cause of a constructor's TypeError; None when none can be told."""
    import inspect

    from mgpucli.config.targets import locate

    try:
        params = inspect.signature(locate(target)).parameters
    except Exception:  # noqa: BLE001 - no signature to read: nothing can be told
        return None
    for key, param in params.items():
        value, default = node.get(key) if key in node else None, param.default
        if not isinstance(value, str) or isinstance(default, str) or default in (None, inspect.Parameter.empty):
            continue
        need = "true or false" if isinstance(default, bool) else "a number" if isinstance(default, int | float) \
            else None
        if need:
            return f"{path}.{key}={value!r} is a string; {target.rsplit('.', 1)[-1]} needs {need}"
    return None


def build_component(path: str, node: DictConfig | dict, *args: Any, source: str) -> Any:
    """``build(node, *args)``, a failure turned into a RecipeError naming ``path`` in recipe ``source``; so is a
    result mgpu can't use there (:func:`kind_problem`). A component's own UsageError (bad input it names itself)
    keeps its message, under ``path``."""
    try:
        built = build(node, *args)
    except RecipeError:
        raise
    except UsageError as err:
        raise RecipeError(source, [f"{path}: {err.message}"], err.hint or f"Fix {path} in the recipe.") from None
    except MgpuError:
        raise
    except Exception as err:
        raise RecipeError(source, [problem(path, str(node.get("_target_")), "building", err, node)],
                          f"Fix {path} in the recipe (or override it); {DEBUG_ENV}=1 shows the whole traceback.",
                          ) from err
    wrong = kind_problem(path, node, built)
    if wrong:
        raise RecipeError(source, [wrong], f"Fix {path} in the recipe (or override it): its _target_ must build that.")
    return built


def kind_problem(path: str, node: DictConfig | dict, built: Any) -> str | None:
    """Why ``built`` (what ``path``'s ``_target_`` returned) is not what mgpu uses there: a model that is no
    ``nn.Module``, a dataset without a length and items, an optimizer that is no ``Optimizer``, a scheduler
    without ``step()``; or a partial (``_partial_: true``) in place of any of them. None when it fits."""
    import torch

    needs = {
        "model": ("a torch.nn.Module", lambda obj: isinstance(obj, torch.nn.Module)),
        "optim": ("a torch.optim.Optimizer", lambda obj: isinstance(obj, torch.optim.Optimizer)),
        "scheduler": ("a learning-rate scheduler (with step())", lambda obj: callable(getattr(obj, "step", None))),
        "data.train": ("a map-style dataset (__len__ and __getitem__)",
                       lambda obj: hasattr(obj, "__len__") and hasattr(obj, "__getitem__")),
    }
    need, fits = needs.get("data.train" if path == "data.val" else path, (None, None))
    if fits is None or fits(built):
        return None
    target = node.get("_target_")
    if node.get("_partial_"):
        return f"{path}: _partial_ is true, so {target} gave a function still to call, where mgpu needs {need}"
    return f"{path}: {target} gave a {type(built).__name__}, where mgpu needs {need}"


def check_builds(cfg: DictConfig, source: str) -> Any:
    """Build the cheap components once, as a worker will, and raise one RecipeError listing every failure; returns
    the model (on the meta device when it builds there). ``${total_steps:}`` and ``${steps_per_epoch:}`` stand for
    plausible numbers here (the loaders don't exist)."""
    import torch

    from mgpucli.config import run_length

    cfg = run_length.resolve(cfg, run_length.RunLength(steps_per_epoch=100, total_steps=1000))
    problems: list[str] = []

    def attempt(path: str, make) -> Any:
        try:
            return make()
        except RecipeError as err:
            problems.extend(err.problems)
            return None

    stand_in = [torch.nn.Parameter(torch.zeros(1))]
    optimizer = attempt("optim", lambda: build_component("optim", cfg.optim, stand_in, source=source))
    if optimizer is not None and cfg.get("scheduler") is not None:
        attempt("scheduler", lambda: build_component("scheduler", cfg.scheduler, optimizer, source=source))
    if isinstance(cfg.get("task"), DictConfig):
        task = attempt("task", lambda: build_component("task", cfg.task, source=source))
        if task is not None:
            problems.extend(metric_problems(cfg, task))
    elif cfg.get("task") in TASK_METRICS:  # a built-in task: its metrics are known without building it
        problems.extend(_metric_name_problems(cfg, list(TASK_METRICS[cfg.get("task")])))
    model = _check_model(cfg, source, problems)
    no_loss = loss_problem(cfg.get("task"), model) if model is not None else None
    if no_loss:
        problems.append(f"task: {no_loss}")
    if problems:
        raise RecipeError(source, problems, f"Fix the keys above (in the recipe or with overrides); {DEBUG_ENV}=1 "
                          "shows the tracebacks.")
    return model


def fit_problems(datasets: dict[str, Any], model: Any) -> list[str]:
    """What doesn't fit between each dataset (``{"data.train": dataset, ...}``) and the model, as the dataset
    tells it (an optional ``model_problems(model) -> list[str]``: mgpu's text datasets check the tokenizer's
    vocabulary against the embeddings and the labels against the head)."""
    problems = []
    for path, dataset in datasets.items():
        check = getattr(dataset, "model_problems", None)
        if dataset is not None and callable(check):
            problems += [f"{path}: {p}" for p in check(model)]
    return problems




def metric_problems(cfg: DictConfig, task: Any) -> list[str]:
    """``trainer.best_metric`` (and the like) must name a metric the task reports, or best.pt never comes."""
    try:
        names = metric_names(task)
    except Exception:  # a custom task whose metrics() can't take unit sums: nothing to check against
        return []
    return _metric_name_problems(cfg, names)


def _metric_name_problems(cfg: DictConfig, names: list[str]) -> list[str]:
    import difflib

    wanted = cfg.trainer.get("best_metric")
    if not wanted or wanted in names:
        return []
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.5)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return [f"trainer.best_metric: '{wanted}' is not a metric the task reports ({', '.join(names)}){hint}"]


def block_problems(cfg: DictConfig, model: Any) -> list[str]:
    """Module class names in ``trainer.fsdp.wrap`` (under fsdp) and ``trainer.activation_checkpointing`` must be
    classes of the model, or every worker would refuse the recipe once it had built its model."""
    trainer = cfg.trainer
    try:
        if trainer.strategy == "fsdp" and trainer.fsdp.wrap:
            select_blocks(model, [str(n) for n in trainer.fsdp.wrap], "trainer.fsdp.wrap")
        blocks_to_checkpoint(model, trainer)
    except UsageError as err:
        return [f"{err.message} {err.hint}" if err.hint else err.message]
    return []


def _check_model(cfg: DictConfig, source: str, problems: list[str]) -> Any:
    """The model built on the meta device (returned; None when it fails); a failure there is confirmed on the CPU
    before it is reported (a model whose code can't run on meta tensors is not the user's mistake)."""
    import torch

    try:
        with torch.device("meta"):
            model = build(cfg.model)
    except UsageError as err:  # the component's own verdict on its arguments: the same on any device
        if isinstance(err, RecipeError):
            raise
        problems.append(f"model: {err.message}")
        return None
    except MgpuError:
        raise
    except Exception:
        try:
            return build_component("model", cfg.model, source=source)
        except RecipeError as err:
            problems.extend(err.problems)
            return None
    wrong = kind_problem("model", cfg.model, model)
    problems.extend([wrong] if wrong else block_problems(cfg, model))
    return None if wrong else model
