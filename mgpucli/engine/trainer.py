"""The Trainer: setup, the step path, fit, evaluate. Runs the same on 1 or N processes.

Its two other parts live beside it: the log interval's reduction and NaN check (engine/interval.py) and the
run dir and checkpoints (engine/trainer_checkpoints.py).

Hot-path rules: no host sync per step (losses and metrics accumulate on the device as sums and are reduced
with one collective per log interval, or per several short ones (engine/interval.py), started at the interval's
last step and read at the next one, so that its latency overlaps that step's work); ``no_sync`` on non-final
accumulation micro-steps; the interval's losses stay on the device, and a non-finite one is found when the
interval's reduction is read, and before every save.
Every tensor op on the step path costs a few microseconds of dispatch even when its data is tiny, and an
OmegaConf attribute read costs more: the step path reads plain settings and adds as few ops as it can
(benchmarks/overhead.py holds it against a hand-written DDP loop).
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mgpucli import faults
from mgpucli.config import run_length
from mgpucli.config.targets import build
from mgpucli.distributed.heartbeat import Progress
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine import state as st
from mgpucli.engine.data import batch_mover, build_loaders
from mgpucli.engine.evaluate import evaluate_exact
from mgpucli.engine.interval import FOLD_EVERY, NO_BAD, Closed, LogInterval, Reduction
from mgpucli.engine.reporter import Reporter
from mgpucli.engine.rundir import MetricsWriter, checkpoint_dir
from mgpucli.engine.strategy import wrap_model
from mgpucli.engine.tasks import build_task
from mgpucli.engine.trainer_checkpoints import Checkpoints
from mgpucli.errors import Preempted


@dataclass(frozen=True, slots=True)
class StepSettings:
    """The trainer settings the step path reads, as plain values (a DictConfig read costs ~7 us; a step made 9)."""

    grad_accum: int
    channels_last: bool
    clip_grad_norm: float | None
    scheduler_interval: str
    log_every: int
    checkpoint_every_steps: int | None
    max_steps: int | None

    @classmethod
    def of(cls, tcfg) -> StepSettings:
        return cls(grad_accum=int(tcfg.grad_accum), channels_last=bool(tcfg.channels_last),
                   clip_grad_norm=tcfg.clip_grad_norm, scheduler_interval=str(tcfg.scheduler_interval),
                   log_every=int(tcfg.log_every), checkpoint_every_steps=tcfg.checkpoint_every_steps,
                   max_steps=tcfg.max_steps)


class Trainer(Checkpoints, LogInterval):
    """One worker's training run. Build with a validated recipe and a Runtime, then call ``fit()``."""

    def __init__(self, cfg: DictConfig, rt: Runtime, reporter: Reporter, resume: str | None = None,
                 overwrite: bool = False):
        self.cfg, self.rt, self.reporter = cfg, rt, reporter
        self.tcfg = cfg.trainer
        self.hot = StepSettings.of(self.tcfg)
        self.resume, self.overwrite = resume, overwrite
        self.step = 0
        self.epoch = 0
        self.best: float | None = None
        self.last_val: dict[str, Any] | None = None
        self.writer: MetricsWriter | None = None
        self.run_dir = Path(cfg.run_dir)
        self._pending: dict[str, Any] | None = None  # resume state applied when the loader is positioned

    # ----------------------------------------------------------------------------------------- setup
    def setup(self) -> None:
        cfg, rt = self.cfg, self.rt
        st.seed_everything(cfg.seed)  # one global seed for init: every rank builds the same model
        train_set = build(cfg.data.train)
        val_set = build(cfg.data.val) if cfg.data.val is not None else None
        model = build(cfg.model)
        self.task = build_task(OmegaConf.to_container(cfg.task) if isinstance(cfg.task, DictConfig) else cfg.task)
        self.loaders = build_loaders(train_set, val_set, cfg.data, cfg.seed, rt)
        # ${total_steps:}/${steps_per_epoch:} become numbers now, before the optimizer and scheduler are built
        length = run_length.of(len(self.loaders.train), self.tcfg.grad_accum, self.tcfg.epochs, self.tcfg.max_steps)
        self.cfg = cfg = run_length.resolve(cfg, length)
        self.tcfg = cfg.trainer
        self.progress = Progress(rt.rank, rt.world_size)  # per-rank progress for timeout messages
        self.progress.start()
        with self.progress.in_phase("setup: DDP parameter broadcast"):
            self.wrapped = wrap_model(model, self.tcfg, rt)
        self.optimizer = build(cfg.optim, self.wrapped.raw.parameters())
        self.scheduler = build(cfg.scheduler, self.optimizer) if cfg.scheduler is not None else None
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.tcfg.precision)
        self.scaler = torch.amp.GradScaler(rt.device.type) if self.tcfg.precision == "fp16" else None
        self.acc = torch.zeros(len(self.task.stat_names), dtype=torch.float64, device=rt.device)
        self.epoch_sums = [0.0] * len(self.task.stat_names)  # the epoch's reduced interval sums (engine/interval.py)
        self.first_bad = torch.full((), NO_BAD, dtype=torch.int64, device=rt.device)
        self._acc_dirty = False  # acc holds sums not yet reduced (Task.stats rows, or a fold of pieces)
        self._bad_folded = False  # first_bad may hold a non-finite step not yet reduced
        self._closed: list[Closed] = []  # log intervals whose sums are made, waiting for their all-reduce
        self._batch = 1  # closed intervals per all-reduce (engine/interval.py), the same on every rank
        self._in_flight: Reduction | None = None  # an all-reduce of closed intervals, finished a step later
        self._losses: list[torch.Tensor] = []  # detached losses not yet checked for NaN/inf (bounded: see _fold)
        self._loss_steps: list[int] = []  # the step each of them belongs to
        self._step_rows: list[Any] = []  # per-step stats pieces, added up by _fold (see Task.step_stats)
        # Precomputed for the step path: a disabled torch.autocast still costs an enter/exit of C calls.
        self._autocast = (functools.partial(torch.autocast, rt.device.type, dtype=self.autocast_dtype)
                          if self.autocast_dtype is not None else contextlib.nullcontext)
        self._no_sync = self.wrapped.train.no_sync if self.wrapped.is_ddp else contextlib.nullcontext
        self._fsdp_accum = self.wrapped.is_fsdp and self.hot.grad_accum > 1
        self._to_device = batch_mover(rt.device, non_blocking=rt.device.type == "cuda")
        self._backward_phase = ("backward (gradient all-reduce)" if rt.distributed
                                and self.wrapped.strategy in ("ddp", "fsdp") else "backward")
        self.signal_received: str | None = None  # set by the signal handler, on this rank only
        self.stop_agreed = False  # set when the ranks agreed (at a log-interval reduction) to stop
        self._faults = faults.enabled()
        self._prepare_run_dir()
        if self.resume_path is not None:
            self._load(self.resume_path)
        st.seed_everything(cfg.seed + 1000 * rt.rank + self.step)  # per-rank randomness (dropout, augmentation)

    # ------------------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train for ``trainer.epochs`` (or until ``trainer.max_steps``); returns the final metrics.

        SIGTERM/SIGINT/SIGUSR1 request a stop; the ranks agree on it when the next log-interval reduction
        is read (within ``trainer.log_every`` + 1 steps, or about REDUCE_EVERY_S where short intervals share
        a reduction), save a checkpoint there and raise Preempted. A second SIGINT interrupts at once.
        """
        steps_per_epoch = math.ceil(len(self.loaders.train) / self.tcfg.grad_accum)
        total_epochs = self.tcfg.epochs if self.tcfg.max_steps is None else max(
            self.tcfg.epochs, math.ceil(self.tcfg.max_steps / steps_per_epoch))
        self.reporter.start({**self._info(steps_per_epoch), "total_epochs": total_epochs})
        train_metrics = None
        with self._stop_signals(), self._tag_failures():
            while self.epoch < total_epochs and not self._done():
                number = self.epoch + 1  # epochs are numbered from 1 in everything a user reads
                train_metrics = self.train_epoch(steps_per_epoch)
                if self.stop_agreed and self._mid_epoch:
                    self._preempt(mid_epoch=True)
                val, saved = self._end_epoch(total_epochs)
                self.reporter.epoch_end(number, train_metrics, val)
                if self.stop_agreed:
                    self._preempt(mid_epoch=False, saved=saved)
        return {"step": self.step, "epoch": self.epoch, "train": train_metrics, "val": self.last_val,
                "run_dir": str(self.run_dir)}

    def _end_epoch(self, total_epochs: int) -> tuple[dict[str, Any] | None, bool]:
        """Validate and checkpoint after an epoch (or after max_steps mid-epoch); returns (val, saved)."""
        tcfg = self.tcfg
        ended_early = self._done() and self._mid_epoch
        number = self.epoch + 1
        if not ended_early:
            self.epoch += 1
        last = self._done() or self.epoch >= total_epochs
        val = None
        if self.loaders.val is not None and tcfg.val_every and (self.epoch % tcfg.val_every == 0 or last):
            val = self.evaluate(number)
        improved = self._maybe_best(val)
        saved = last or (tcfg.checkpoint_every and self.epoch % tcfg.checkpoint_every == 0) or improved
        if saved:
            self.save(mid_epoch=ended_early, best=improved)
        return val, bool(saved)

    @contextlib.contextmanager
    def _tag_failures(self):
        """Tag escaping errors with the step, so `mgpu launch` can tell a failure that repeats from a new one."""
        try:
            yield
        except Preempted:
            raise  # not a failure: it carries the step its checkpoint holds (Preempted.step)
        except Exception as err:
            err.mgpu_step = self.step + 1
            raise

    @contextlib.contextmanager
    def _stop_signals(self):
        """Turn SIGTERM/SIGINT/SIGUSR1 into a stop request (main thread only; restored afterwards)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum, frame):
            if self.signal_received is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
            self.signal_received = signal.Signals(signum).name

        wanted = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
        previous = {sig: signal.signal(sig, request_stop) for sig in wanted}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _preempt(self, mid_epoch: bool, saved: bool = False) -> None:
        if not saved:
            self.save(mid_epoch=mid_epoch)
        raise Preempted(
            f"stopped by {self.signal_received or 'a signal on another rank'} at step {self.step} "
            f"(epoch {self.epoch + 1 if mid_epoch else self.epoch}); every rank agreed on that step and the checkpoint "
            f"in {checkpoint_dir(self.run_dir)} is complete.",
            "Continue the run with the same command plus --resume auto.",
            step=self.step, signal=self.signal_received,
        )

    def _done(self) -> bool:
        return self.hot.max_steps is not None and self.step >= self.hot.max_steps

    def train_epoch(self, steps_per_epoch: int) -> dict[str, Any] | None:
        """One pass over this rank's shard (from the saved position when resuming mid-epoch); returns the epoch's
        train metrics: means over all the samples it logged (None if it logged none)."""
        hot, loader = self.hot, self.loaders.train
        self.loaders.sampler.set_epoch(self.epoch)
        pending, self._pending = self._pending, None
        if pending and pending["loader"] is not None:
            loader.load_state_dict(pending["loader"])  # mid-epoch: epoch_sums came with the checkpoint
        else:
            self.epoch_sums = [0.0] * len(self.epoch_sums)
        batches = iter(loader)  # building the iterator draws from the RNG: restore RNG after it
        if pending and pending["rng"] is not None:
            st.restore_rng(pending["rng"], self.rt.device)
        done_in_epoch = self.step - self.epoch * steps_per_epoch
        self.reporter.epoch_start(self.epoch + 1, steps_per_epoch, max(0, done_in_epoch))
        self.wrapped.train.train()
        self._mid_epoch = True
        self._interval_start, self._interval_steps = time.perf_counter(), 0
        micro = 0
        for batch in batches:
            micro += 1
            final = micro == hot.grad_accum
            self._forward_backward(batch, sync=final)
            if final:
                micro = 0
                self._optimizer_step()
                if self.stop_agreed or self._done():  # every rank stops at the same step
                    self._reduce_and_log()
                    return self._epoch_means()
        if micro:  # a partial accumulation at the end of the epoch still makes a step
            self._optimizer_step()
        self._mid_epoch = False
        self._reduce_and_log()
        if self.scheduler is not None and hot.scheduler_interval == "epoch":
            self.scheduler.step()
        return self._epoch_means()

    def _epoch_means(self) -> dict[str, Any] | None:
        samples = self.epoch_sums[self.task.stat_names.index("samples")] if "samples" in self.task.stat_names else 1
        return self.task.metrics(self.epoch_sums) if samples else None

    def _forward_backward(self, batch, sync: bool) -> None:
        inputs, targets = self._to_device(batch)
        if self.hot.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        self.progress.step, self.progress.phase = self.step + 1, "forward"  # two attribute writes: no I/O
        if self._fsdp_accum:  # FSDP2's no_sync: reduce-scatter on the last micro-step only
            self.wrapped.train.set_requires_gradient_sync(sync)
        if sync or self._no_sync is contextlib.nullcontext:
            self._step_on_device(inputs, targets, sync)
        else:  # DDP decides in forward whether backward all-reduces: not on non-final micro-steps
            with self._no_sync():
                self._step_on_device(inputs, targets, sync)

    def _step_on_device(self, inputs, targets, sync: bool) -> None:
        """Forward, loss, bookkeeping, backward (context managers only where they do something: each costs
        microseconds to enter and leave, which a ~1 ms step notices)."""
        if self.autocast_dtype is None:
            outputs = self.wrapped.train(inputs)
            loss = self.task.loss(outputs, targets)
        else:
            with self._autocast():
                outputs = self.wrapped.train(inputs)
                loss = self.task.loss(outputs, targets)
        if self._faults and faults.maybe_fault("step", self.rt.rank, self.step + 1):
            loss = loss * float("nan")
        detached = loss.detach()
        row = self.task.step_stats(outputs, targets, detached)
        if isinstance(row, torch.Tensor):
            self.acc += row
            self._acc_dirty = True
        else:  # pieces: the tensor work that needs no outputs waits for _fold (one op here, not five)
            self._step_rows.append(row)
        # Keep the loss on the device; _fold finds the first non-finite one once per interval (no sync here).
        self._losses.append(detached)
        self._loss_steps.append(self.step + 1)
        if len(self._losses) >= FOLD_EVERY:
            self._fold()
        scaled = loss if self.hot.grad_accum == 1 else loss / self.hot.grad_accum
        self.progress.phase = self._backward_phase if sync else "backward"
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()

    def _optimizer_step(self) -> None:
        hot = self.hot
        if hot.clip_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.wrapped.raw.parameters(), hot.clip_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None and hot.scheduler_interval == "step":
            self.scheduler.step()
        self.step += 1
        self._interval_steps += 1
        self.reporter.step(self.step)
        if self._in_flight is not None:
            self._finish_reduction()  # started a step ago
        if self.step % hot.log_every == 0:
            self._close_interval()
            if len(self._closed) >= self._batch:
                self._start_reduction()
        if hot.checkpoint_every_steps and self.step % hot.checkpoint_every_steps == 0 and not self._done():
            self.save(mid_epoch=True)

    def evaluate(self, epoch: int) -> dict[str, Any]:
        """Exact validation (see engine.evaluate) after ``epoch`` (numbered from 1); recorded in metrics.jsonl and
        kept for the checkpoint."""
        with self.progress.in_phase("validation"):
            self.last_val = evaluate_exact(self.wrapped.eval, self.loaders.val, self.loaders.val_batches,
                                           self.task, self.rt, self.autocast_dtype, lockstep=self.wrapped.is_fsdp)
        self._emit({"split": "val", "step": self.step, "epoch": epoch, **self.last_val, "time": time.time()})
        return self.last_val

    def _info(self, steps_per_epoch: int) -> dict[str, Any]:
        d, rt = self.cfg.data, self.rt
        return {
            "name": self.cfg.name, "run_dir": str(self.run_dir), "world_size": rt.world_size,
            "device": str(rt.device), "backend": rt.backend or "none", "strategy": self.wrapped.strategy,
            "cpu_threads": rt.cpu_threads, "num_workers": self.loaders.num_workers,
            "batch_size": d.batch_size, "grad_accum": self.tcfg.grad_accum,
            "global_batch": d.batch_size * rt.world_size * self.tcfg.grad_accum,
            "train_samples": len(self.loaders.train.dataset),
            "val_samples": len(self.loaders.val.dataset) if self.loaders.val is not None else 0,
            "steps_per_epoch": steps_per_epoch, "epochs": self.tcfg.epochs, "max_steps": self.tcfg.max_steps,
            "precision": self.tcfg.precision,
        }

    def close(self) -> None:
        """Close files and drop the model, optimizer and loaders (tracebacks may keep this object alive)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if getattr(self, "progress", None) is not None:
            self.progress.stop()
        for name in ("wrapped", "optimizer", "scheduler", "scaler", "loaders"):
            self.__dict__.pop(name, None)
