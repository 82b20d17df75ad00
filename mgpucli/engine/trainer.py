"""The Trainer: builds a run's parts, then runs its epochs and steps. The same on 1 or N processes.

Its parts, each with one job: :class:`~mgpucli.engine.log_interval.LogInterval` (training metrics as device sums,
one collective per log interval, the ranks' agreement on a stop or a non-finite loss), :class:`~mgpucli.engine.
checkpointing.Checkpoints` (the run dir, saving and restoring), :class:`~mgpucli.engine.stop_requests.
StopRequests` (signals), and the strategy's wrapped model (:mod:`mgpucli.engine.strategy`). What is left here is
the loop: epochs, the step (:meth:`Trainer.train_step`), validation, and when to save.

The step path's rules: no host sync per step (metrics stay on the device until the log interval), one collective
per log interval beside the gradients' own, ``no_sync`` on the micro-steps of an accumulation but its last.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from mgpucli import faults
from mgpucli.config import run_length
from mgpucli.config.components import build_component, metric_problems
from mgpucli.distributed.heartbeat import Heartbeat
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine import state as engine_state
from mgpucli.engine.checkpointing import Checkpoints, Position, Resumed, Trained
from mgpucli.engine.data import build_loaders, to_device
from mgpucli.engine.evaluate import evaluate_exact
from mgpucli.engine.log_interval import LogInterval
from mgpucli.engine.reporter import Reporter
from mgpucli.engine.rundir import MetricsWriter
from mgpucli.engine.stop_requests import StopRequests
from mgpucli.engine.strategy import wrap_model
from mgpucli.engine.tasks import build_task
from mgpucli.errors import Preempted, RecipeError
from mgpucli.run_files import checkpoint_dir

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


class Trainer:
    """One worker's training run. Build with a validated recipe and a Runtime, call ``setup()``, then ``fit()``."""

    def __init__(self, cfg: DictConfig, runtime: Runtime, reporter: Reporter, resume: str | None = None,
                 overwrite: bool = False, source: str = "the recipe"):
        self.cfg, self.runtime, self.reporter = cfg, runtime, reporter
        self.source = source  # the recipe as the user named it, for problems found while building
        self.resume, self.overwrite = resume, overwrite
        self.position = Position()
        self.stop = StopRequests()
        self.writer: MetricsWriter | None = None
        self.heartbeat: Heartbeat | None = None
        self._resumed: Resumed | None = None  # applied when the epoch's loader iterator exists
        self._mid_epoch = False

    @property
    def step(self) -> int:
        return self.position.step

    # ----------------------------------------------------------------------------------------- setup
    def setup(self) -> None:
        """Build everything (in the order that makes every rank's model the same), take the run dir, resume."""
        cfg, runtime = self.cfg, self.runtime
        engine_state.seed_everything(cfg.seed)  # one global seed for init: every rank builds the same model
        source = self.source
        train_set = build_component("data.train", cfg.data.train, source=source)
        val_set = build_component("data.val", cfg.data.val, source=source) if cfg.data.val is not None else None
        model = build_component("model", cfg.model, source=source)
        self.task = (build_component("task", cfg.task, source=source) if isinstance(cfg.task, DictConfig)
                     else build_task(cfg.task))
        wrong_metric = metric_problems(cfg, self.task)
        if wrong_metric:
            raise RecipeError(source, wrong_metric, "Name one of the metrics listed, or drop it.")
        self.loaders = build_loaders(train_set, val_set, cfg.data, cfg.seed, runtime)
        # ${total_steps:}/${steps_per_epoch:} become numbers now, before the optimizer and scheduler are built
        length = run_length.of(len(self.loaders.train), cfg.trainer.grad_accum, cfg.trainer.epochs,
                               cfg.trainer.max_steps)
        self.cfg = cfg = run_length.resolve(cfg, length)
        self.settings = LoopSettings.of(cfg.trainer)
        self.heartbeat = Heartbeat(runtime.rank, runtime.world_size)  # where each rank is, for timeout messages
        self.heartbeat.start()
        with self.heartbeat.in_phase("setup: DDP parameter broadcast"):
            wrapped = wrap_model(model, cfg.trainer, runtime)
        optimizer = build_component("optim", cfg.optim, wrapped.raw.parameters(), source=source)
        scheduler = (build_component("scheduler", cfg.scheduler, optimizer, source=source)
                     if cfg.scheduler is not None else None)
        self.autocast_dtype = _AUTOCAST.get(cfg.trainer.precision)
        scaler = torch.amp.GradScaler(runtime.device.type) if cfg.trainer.precision == "fp16" else None
        self.trained = Trained(wrapped, optimizer, scheduler, scaler, self.loaders.train)
        self.intervals = LogInterval(self.task, runtime, self.heartbeat, self._emit)
        self.checkpoints = Checkpoints(cfg, runtime, self.heartbeat, self.reporter)
        self._backward_phase = ("backward (gradient all-reduce)" if runtime.distributed
                                and wrapped.strategy in ("ddp", "fsdp") else "backward")
        self._faults = faults.enabled()
        found = self.checkpoints.check_run_dir(self.resume, self.overwrite)
        if found is not None:  # loaded before the run dir is taken: a checkpoint that doesn't fit leaves it as it was
            self._resumed = self.checkpoints.load(found, self.trained, self.position)
            sums = self._resumed.epoch_sums
            if sums is not None and len(sums) == len(self.task.stat_names):
                self.intervals.epoch_sums = sums
        self.checkpoints.take_run_dir(self.overwrite)
        if runtime.is_main:
            self.writer = MetricsWriter(self.checkpoints.run_dir, tensorboard=cfg.trainer.tensorboard)
        engine_state.seed_everything(cfg.seed + 1000 * runtime.rank + self.step)  # per-rank randomness

    # ------------------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train for ``trainer.epochs`` (or until ``trainer.max_steps``); returns the final metrics.

        SIGTERM/SIGINT/SIGUSR1 request a stop; the ranks agree on it when the next log-interval reduction is read
        (within ``trainer.log_every`` + 1 steps), save a checkpoint there and raise Preempted.
        """
        settings = self.settings
        steps_per_epoch = math.ceil(len(self.loaders.train) / settings.grad_accum)
        total_epochs = settings.epochs if settings.max_steps is None else max(
            settings.epochs, math.ceil(settings.max_steps / steps_per_epoch))
        self.reporter.start({**self._info(steps_per_epoch), "total_epochs": total_epochs})
        train_metrics = None
        with self.stop.listening(), self._tag_failures():
            while self.position.epoch < total_epochs and not self._done():
                number = self.position.epoch + 1  # epochs are numbered from 1 in everything a user reads
                train_metrics = self.train_epoch(steps_per_epoch)
                if self.intervals.stop_agreed and self._mid_epoch:
                    self._preempt(mid_epoch=True)
                val, saved = self._end_epoch(total_epochs)
                self.reporter.epoch_end(number, train_metrics, val)
                if self.intervals.stop_agreed:
                    self._preempt(mid_epoch=False, saved=saved)
        return {"step": self.step, "epoch": self.position.epoch, "train": train_metrics,
                "val": self.position.last_val, "run_dir": str(self.checkpoints.run_dir)}

    def train_epoch(self, steps_per_epoch: int) -> dict[str, Any] | None:
        """One pass over this rank's shard (from the saved position when resuming mid-epoch); returns the epoch's
        train metrics: means over all its samples (None if it had none)."""
        position, loader = self.position, self.loaders.train
        self.loaders.sampler.set_epoch(position.epoch)
        resumed, self._resumed = self._resumed, None
        if resumed is not None and resumed.loader is not None:
            loader.load_state_dict(resumed.loader)  # mid-epoch: the epoch's sums came with the checkpoint
        else:
            self.intervals.new_epoch()
        batches = iter(loader)  # building the iterator draws from the RNG: restore RNG after it
        if resumed is not None and resumed.rng is not None:
            engine_state.restore_rng(resumed.rng, self.runtime.device)
        done = max(0, position.step - position.epoch * steps_per_epoch)
        self.reporter.epoch_start(position.epoch + 1, steps_per_epoch, done)
        self.trained.model.train.train()
        self._mid_epoch = True
        while self.train_step(batches):
            if self.intervals.stop_agreed or self._done():  # every rank stops at the same step
                self._flush()
                return self.intervals.epoch_means()
        self._mid_epoch = False
        self._flush()
        if self.trained.scheduler is not None and self.settings.scheduler_interval == "epoch":
            self.trained.scheduler.step()
        return self.intervals.epoch_means()

    def train_step(self, batches: Iterator) -> bool:
        """One optimizer step: forward and backward on up to ``trainer.grad_accum`` micro-batches taken from
        ``batches`` one at a time (gradients synchronised on the last one only; an epoch's last, partial
        accumulation still steps), then the optimizer step and the log interval's bookkeeping. Returns False, having
        done nothing, when ``batches`` is exhausted."""
        batch = next(batches, None)
        if batch is None:
            return False
        for micro in range(1, self.settings.grad_accum + 1):
            following = next(batches, None) if micro < self.settings.grad_accum else None
            self._forward_backward(batch, sync=following is None)
            if following is None:
                break
            batch = following
        self._optimizer_step()
        return True

    def _forward_backward(self, batch, sync: bool) -> None:
        model, runtime = self.trained.model, self.runtime
        inputs, targets = to_device(batch, runtime.device, non_blocking=runtime.device.type == "cuda")
        if self.settings.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        step = self.step + 1
        self.heartbeat.step, self.heartbeat.phase = step, "forward"
        if model.is_fsdp and self.settings.grad_accum > 1:  # FSDP2's no_sync: reduce-scatter on the last only
            model.train.set_requires_gradient_sync(sync)
        # DDP decides in forward whether backward all-reduces: not on the micro-steps before the last.
        skip_sync = model.train.no_sync() if model.is_ddp and not sync else contextlib.nullcontext()
        with skip_sync:
            autocast = self.autocast_dtype is not None
            with torch.autocast(runtime.device.type, dtype=self.autocast_dtype, enabled=autocast):
                outputs = model.train(inputs)
                loss = self.task.loss(outputs, targets)
            if self._faults and faults.maybe_fault("step", runtime.rank, step):
                loss = loss * float("nan")
            detached = loss.detach()
            self.intervals.add(self.task.stats(outputs, targets, detached), detached, step)
            scaled = loss / self.settings.grad_accum if self.settings.grad_accum > 1 else loss
            self.heartbeat.phase = self._backward_phase if sync else "backward"
            scaler = self.trained.scaler
            (scaler.scale(scaled) if scaler is not None else scaled).backward()

    def _optimizer_step(self) -> None:
        settings, trained, position = self.settings, self.trained, self.position
        optimizer, scaler = trained.optimizer, trained.scaler
        if settings.clip_grad_norm is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trained.model.raw.parameters(), settings.clip_grad_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if trained.scheduler is not None and settings.scheduler_interval == "step":
            trained.scheduler.step()
        position.step += 1
        self.intervals.steps += 1
        self.reporter.step(position.step)
        self.intervals.read_reduction()  # the all-reduce started a step ago
        if position.step % settings.log_every == 0:
            self.intervals.close_and_reduce(position.step, position.epoch + 1, self._lr(),
                                            stop_requested=self.stop.received is not None)
        every = settings.checkpoint_every_steps
        if every and position.step % every == 0 and not self._done():
            self.save(mid_epoch=True)

    # ----------------------------------------------------------------------------- epoch ends, saving
    def _end_epoch(self, total_epochs: int) -> tuple[dict[str, Any] | None, bool]:
        """Validate and checkpoint after an epoch (or after max_steps mid-epoch); returns (val, saved)."""
        settings, position = self.settings, self.position
        ended_early = self._done() and self._mid_epoch
        number = position.epoch + 1
        if not ended_early:
            position.epoch += 1
        last = self._done() or position.epoch >= total_epochs
        val = None
        if self.loaders.val is not None and settings.val_every and (position.epoch % settings.val_every == 0 or last):
            val = self.evaluate(number)
        improved = self.checkpoints.improves_best(val)
        saved = last or (settings.checkpoint_every and position.epoch % settings.checkpoint_every == 0) or improved
        if saved:
            self.save(mid_epoch=ended_early, best=improved)
        return val, bool(saved)

    def save(self, mid_epoch: bool, best: bool = False) -> None:
        """Record every step so far (which also checks them all for a non-finite loss), then checkpoint."""
        self._flush()
        self.checkpoints.save(self.trained, self.position, self.intervals.epoch_sums, mid_epoch, best)

    def _flush(self) -> None:
        self.intervals.flush(self.step, self.position.epoch + 1, self._lr(), self.stop.received is not None)

    def _preempt(self, mid_epoch: bool, saved: bool = False) -> None:
        if not saved:
            self.save(mid_epoch=mid_epoch)
        epoch = self.position.epoch + 1 if mid_epoch else self.position.epoch
        raise Preempted(
            f"stopped by {self.stop.received or 'a signal on another rank'} at step {self.step} (epoch {epoch}); "
            f"every rank agreed on that step and the checkpoint in {checkpoint_dir(self.checkpoints.run_dir)} is "
            "complete.",
            "Continue the run with the same command plus --resume auto.",
            step=self.step, signal=self.stop.received,
        )

    def _done(self) -> bool:
        return self.settings.max_steps is not None and self.step >= self.settings.max_steps

    def _lr(self) -> float:
        return self.trained.optimizer.param_groups[0]["lr"]

    @contextlib.contextmanager
    def _tag_failures(self):
        """Tag escaping errors with the step, so `mgpu launch` can tell a failure that repeats from a new one."""
        try:
            yield
        except Exception as err:
            err.mgpu_step = self.step + 1
            raise

    # ------------------------------------------------------------------------------------ validation
    def evaluate(self, epoch: int) -> dict[str, Any]:
        """Exact validation (see engine.evaluate) after ``epoch`` (numbered from 1); recorded in metrics.jsonl and
        kept for the checkpoint."""
        model = self.trained.model
        with self.heartbeat.in_phase("validation"):
            self.position.last_val = evaluate_exact(model.eval, self.loaders.val, self.loaders.val_batches, self.task,
                                                    self.runtime, self.autocast_dtype, lockstep=model.is_fsdp)
        self._emit({"split": "val", "step": self.step, "epoch": epoch, **self.position.last_val, "time": time.time()})
        return self.position.last_val

    def _emit(self, record: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write(record)
        self.reporter.log(record)

    def _info(self, steps_per_epoch: int) -> dict[str, Any]:
        data, runtime, trainer = self.cfg.data, self.runtime, self.cfg.trainer
        return {
            "name": self.cfg.name, "run_dir": str(self.checkpoints.run_dir), "world_size": runtime.world_size,
            "device": str(runtime.device), "backend": runtime.backend or "none",
            "strategy": self.trained.model.strategy, "cpu_threads": runtime.cpu_threads,
            "num_workers": self.loaders.num_workers, "batch_size": data.batch_size, "grad_accum": trainer.grad_accum,
            "global_batch": data.batch_size * runtime.world_size * trainer.grad_accum,
            "train_samples": len(self.loaders.train.dataset),
            "val_samples": len(self.loaders.val.dataset) if self.loaders.val is not None else 0,
            "steps_per_epoch": steps_per_epoch, "epochs": trainer.epochs, "max_steps": trainer.max_steps,
            "precision": trainer.precision,
        }

    def close(self) -> None:
        """Close files and drop the model, optimizer and loaders (tracebacks may keep this object alive)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.heartbeat is not None:
            self.heartbeat.stop()
        for name in ("trained", "loaders", "intervals", "checkpoints"):
            self.__dict__.pop(name, None)
