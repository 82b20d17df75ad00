"""Building a run's parts from a checked recipe, in the order that makes every rank's model the same.

Datasets, model and task first (one global seed, so every rank builds identical weights), then the loaders (their
length resolves ``${total_steps:}``/``${steps_per_epoch:}``), the strategy's wrapping, the optimizer, the scheduler,
and the optional parts (EMA, early stopping). Whatever a component's constructor raises is a problem in the recipe
(:func:`mgpucli.config.components.build_component`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from mgpucli.config import run_length
from mgpucli.config.components import build_component, fit_problems, metric_problems
from mgpucli.distributed.heartbeat import Heartbeat
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.checkpoints import state as engine_state
from mgpucli.engine.checkpoints.training import Trained
from mgpucli.engine.data import Loaders, build_loaders
from mgpucli.engine.early_stopping import EarlyStopping
from mgpucli.engine.ema import EMA
from mgpucli.engine.reporter import Reporter
from mgpucli.engine.strategy import wrap_model
from mgpucli.engine.tasks import Task, bind_task, build_task
from mgpucli.errors import RecipeError, UsageError
from mgpucli.model_facts import loss_problem

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class LoopSettings:
    """The ``trainer`` settings the loop reads, as plain values (read once, not from the DictConfig each step)."""

    epochs: int
    max_steps: int | None
    grad_accum: int
    channels_last: bool
    clip_grad_norm: float | None
    scheduler_interval: str
    log_every: int
    val_every: int
    checkpoint_every: int
    checkpoint_every_steps: int | None

    @classmethod
    def of(cls, trainer: DictConfig) -> LoopSettings:
        return cls(epochs=int(trainer.epochs), max_steps=trainer.max_steps, grad_accum=int(trainer.grad_accum),
                   channels_last=bool(trainer.channels_last), clip_grad_norm=trainer.clip_grad_norm,
                   scheduler_interval=str(trainer.scheduler_interval), log_every=int(trainer.log_every),
                   val_every=int(trainer.val_every), checkpoint_every=int(trainer.checkpoint_every),
                   checkpoint_every_steps=trainer.checkpoint_every_steps)


@dataclass
class Built:
    """A run's parts: the recipe with its run length resolved, and what trains."""

    cfg: DictConfig
    task: Task
    loaders: Loaders
    trained: Trained
    settings: LoopSettings
    total_steps: int
    autocast_dtype: Any  # torch.bfloat16 / torch.float16, or None for fp32


def build_task_for(cfg: DictConfig, model: torch.nn.Module, source: str) -> Task:
    """The recipe's task (a built-in name or a ``_target_``), bound to ``model`` (a task may read its number of
    labels); a task that doesn't fit the model is a problem in the recipe (exit 2)."""
    task = (build_component("task", cfg.task, source=source) if isinstance(cfg.task, DictConfig)
            else build_task(cfg.task))
    try:
        bind_task(task, model)
    except UsageError as err:
        raise RecipeError(source, [f"task: {err.message}"], err.hint) from None
    no_loss = loss_problem(cfg.task, model)
    if no_loss:
        raise RecipeError(source, [f"task: {no_loss}"], "Make the model and the task fit.")
    return task


def build_run(cfg: DictConfig, runtime: Runtime, heartbeat: Heartbeat, reporter: Reporter, source: str) -> Built:
    """Build every part of the run on this rank (``source``: the recipe as the user named it, for problems)."""
    engine_state.seed_everything(cfg.seed)  # one global seed for init: every rank builds the same model
    train_set = build_component("data.train", cfg.data.train, source=source)
    val_set = build_component("data.val", cfg.data.val, source=source) if cfg.data.val is not None else None
    model = build_component("model", cfg.model, source=source)
    misfits = fit_problems({"data.train": train_set, "data.val": val_set}, model)
    if misfits:
        raise RecipeError(source, misfits, "Make the data and the model fit (the fix is named with each problem).")
    task = build_task_for(cfg, model, source)
    wrong_metric = metric_problems(cfg, task)
    if wrong_metric:
        raise RecipeError(source, wrong_metric, "Name one of the metrics listed, or drop it.")
    stopping = EarlyStopping(**cfg.trainer.early_stopping) if cfg.trainer.early_stopping is not None else None
    if stopping is not None:
        stopping.check_metric(task)
    loaders = build_loaders(train_set, val_set, cfg.data, cfg.seed, runtime)
    # ${total_steps:}/${steps_per_epoch:} become numbers now, before the optimizer and scheduler are built
    length = run_length.of(len(loaders.train), cfg.trainer.grad_accum, cfg.trainer.epochs, cfg.trainer.max_steps)
    cfg = run_length.resolve(cfg, length)
    with heartbeat.in_phase("setup: DDP parameter broadcast"):
        wrapped = wrap_model(model, cfg.trainer, runtime)
    if wrapped.checkpointed:
        reporter.message(f"activation checkpointing: {wrapped.checkpointed} block(s) recompute their activations "
                         "in backward")
    optimizer = build_component("optim", cfg.optim, wrapped.raw.parameters(), source=source)
    scheduler = (build_component("scheduler", cfg.scheduler, optimizer, source=source)
                 if cfg.scheduler is not None else None)
    scaler = torch.amp.GradScaler(runtime.device.type) if cfg.trainer.precision == "fp16" else None
    ema = EMA(wrapped.raw, **cfg.trainer.ema) if cfg.trainer.ema is not None else None
    trained = Trained(wrapped, optimizer, scheduler, scaler, loaders.train, ema, stopping)
    return Built(cfg, task, loaders, trained, LoopSettings.of(cfg.trainer), length.total_steps,
                 _AUTOCAST.get(cfg.trainer.precision))
