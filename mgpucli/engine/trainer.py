"""The Trainer: setup, train_step, evaluate, checkpoint, fit. Runs the same on 1 or N processes.

Hot-path rules: no host sync per step (losses and metrics accumulate on the device as sums and are reduced
with one collective per log interval, started at the interval's last step and read at the next one, so that
its latency overlaps that step's work); ``no_sync`` on non-final accumulation micro-steps; the interval's losses
stay on the device, and a non-finite one is found when the interval's reduction is read, and before every save.
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
from mgpucli.config.targets import build
from mgpucli.dist import runtime as dist_rt
from mgpucli.dist.runtime import Runtime
from mgpucli.dist.watch import Progress
from mgpucli.engine import state as st
from mgpucli.engine.checkpoint import copy_atomic, save_atomic
from mgpucli.engine.data import build_loaders, to_device
from mgpucli.engine.evaluate import evaluate_exact
from mgpucli.engine.report import Reporter
from mgpucli.engine.rundir import MetricsWriter, checkpoint_dir, prepare_run_dir
from mgpucli.engine.sharded import load_sharded, save_sharded
from mgpucli.engine.strategy import wrap_model
from mgpucli.engine.tasks import Later, _constant, build_task
from mgpucli.errors import JobFailed, Preempted

_NO_BAD = 2**62  # "no non-finite step yet" (min-reducible)
_FOLD_EVERY = 256  # pending losses and step pieces are folded at the latest after this many micro-steps


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


@dataclass(slots=True)
class _Reduction:
    """A log interval's all-reduce in flight, and what its record needs once it is done."""

    vec: torch.Tensor
    work: Any  # the collective's handle (None on one process)
    losses: list[torch.Tensor]  # the interval's pending losses, to find a non-finite one's step
    loss_steps: list[int]
    step: int
    epoch: int
    elapsed: float
    lr: float
    time: float


def sum_step_rows(rows: list[Any], device: torch.device) -> torch.Tensor:
    """Column sums of step pieces (see Task.step_stats) as one float64 vector on ``device``."""
    return _float64_vector(column_sums(rows, device))


def column_sums(rows: list[Any], device: torch.device) -> list[torch.Tensor]:
    """One device scalar per column of step pieces: its sum (float64, or a :class:`Later`'s own dtype)."""
    return [_sum_column(column, device) for column in zip(*rows, strict=True)]


def _float64_vector(scalars: list[torch.Tensor]) -> torch.Tensor:
    """Scalars stacked as float64 in one op: ``stack`` promotes exactly next to a float64 value (integer counts
    and float32 sums alike); only without one does each need converting first."""
    if not any(t.dtype == torch.float64 for t in scalars):
        scalars = [t.to(torch.float64) for t in scalars]
    return torch.stack(scalars)


def _sum_column(column: tuple, device: torch.device) -> torch.Tensor:
    """Device scalars are stacked and summed; host numbers summed exactly in Python; ``(scalar, number)`` pairs
    multiplied (the same float32 products a step would have computed); :class:`Later` pieces run once on their
    concatenated tensors. Sums in float64. The interval pays each of these ops once, and every op it avoids
    counts (an op on a cold cache right after a step costs ~10 us): one batch size is a scalar factor, not a
    copied tensor, and a host total is a cached constant."""
    parts = []
    pairs = [p for p in column if isinstance(p, tuple)]
    if pairs:
        values = torch.stack([t for t, _ in pairs])
        factors = [m for _, m in pairs]
        if factors.count(factors[0]) == len(factors):
            parts.append((values * factors[0]).sum(dtype=torch.float64))
        else:
            host = torch.tensor(factors, dtype=values.dtype if values.is_floating_point() else None)
            parts.append((values * _to(host, device)).sum(dtype=torch.float64))
    tensors = [p for p in column if isinstance(p, torch.Tensor)]
    if tensors:
        parts.append(torch.stack(tensors).sum(dtype=torch.float64))
    later = [p for p in column if isinstance(p, Later)]
    if later:
        try:
            joined = [torch.cat(group) for group in zip(*(p.tensors for p in later), strict=True)]
            parts.append(later[0].fn(*joined))
        except RuntimeError:  # tensors that don't concatenate (other shapes): one call per step
            parts.append(torch.stack([p.fn(*p.tensors) for p in later]).sum(dtype=torch.float64))
    numbers = [p for p in column if not isinstance(p, (tuple, torch.Tensor, Later))]
    if numbers:
        parts.append(_constant(float(sum(numbers)), device))
    return parts[0] if len(parts) == 1 else _float64_vector(parts).sum()


def _to(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without blocking (and without a no-op ``.to`` on the CPU)."""
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


class Trainer:
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
        self.progress = Progress(rt.rank, rt.world_size)  # per-rank progress for timeout messages
        self.progress.start()
        with self.progress.in_phase("setup: DDP parameter broadcast"):
            self.wrapped = wrap_model(model, self.tcfg, rt)
        self.optimizer = build(cfg.optim, self.wrapped.raw.parameters())
        self.scheduler = build(cfg.scheduler, self.optimizer) if cfg.scheduler is not None else None
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.tcfg.precision)
        self.scaler = torch.amp.GradScaler(rt.device.type) if self.tcfg.precision == "fp16" else None
        self.acc = torch.zeros(len(self.task.stat_names), dtype=torch.float64, device=rt.device)
        self.first_bad = torch.full((), _NO_BAD, dtype=torch.int64, device=rt.device)
        self._acc_dirty = False  # acc holds sums not yet reduced (Task.stats rows, or a fold of pieces)
        self._bad_folded = False  # first_bad may hold a non-finite step not yet reduced
        self._in_flight: _Reduction | None = None  # a log interval's all-reduce, finished a step later
        self._losses: list[torch.Tensor] = []  # detached losses not yet checked for NaN/inf (bounded: see _fold)
        self._loss_steps: list[int] = []  # the step each of them belongs to
        self._step_rows: list[Any] = []  # per-step stats pieces, added up by _fold (see Task.step_stats)
        # Precomputed for the step path: a disabled torch.autocast still costs an enter/exit of C calls.
        self._autocast = (functools.partial(torch.autocast, rt.device.type, dtype=self.autocast_dtype)
                          if self.autocast_dtype is not None else contextlib.nullcontext)
        self._no_sync = self.wrapped.train.no_sync if self.wrapped.is_ddp else contextlib.nullcontext
        self._fsdp_accum = self.wrapped.is_fsdp and self.hot.grad_accum > 1
        self._non_blocking = rt.device.type == "cuda"
        self._backward_phase = ("backward (gradient all-reduce)" if rt.distributed
                                and self.wrapped.strategy in ("ddp", "fsdp") else "backward")
        self.signal_received: str | None = None  # set by the signal handler, on this rank only
        self.stop_agreed = False  # set when the ranks agreed (at a log-interval reduction) to stop
        self._faults = faults.enabled()
        self._prepare_run_dir()
        if self.resume_path is not None:
            self._load(self.resume_path)
        st.seed_everything(cfg.seed + 1000 * rt.rank + self.step)  # per-rank randomness (dropout, augmentation)

    def _prepare_run_dir(self) -> None:
        """Rank 0 decides (and creates) the run dir; every rank gets the same verdict, so all fail together."""
        from mgpucli.errors import UsageError

        resume = self.resume
        path = checkpoint_dir(self.run_dir) / ("last.dcp" if self.tcfg.checkpoint_format == "sharded" else "last.pt")
        self.resume_path = None
        if resume == "auto":
            self.resume_path = path if path.exists() else None
        elif resume:
            self.resume_path = Path(resume)
        problem = None
        if self.rt.is_main:
            try:
                prepare_run_dir(self.run_dir, self.resume_path is not None, self.overwrite,
                                OmegaConf.to_yaml(self.cfg, resolve=True))
                self.writer = MetricsWriter(self.run_dir, tensorboard=self.tcfg.tensorboard)
            except UsageError as err:
                problem = (err.message, err.hint)
        with self.progress.in_phase("setup: run-dir check (broadcast from rank 0)"):
            problem = dist_rt.broadcast_object(problem, self.rt)
        if problem:
            raise UsageError(*problem)

    # ------------------------------------------------------------------------------------ checkpoints
    @property
    def _sharded(self) -> bool:
        return self.tcfg.checkpoint_format == "sharded" and self.wrapped.is_fsdp

    def _load(self, path: Path) -> None:
        if path.is_dir():
            meta = load_sharded(self.wrapped.raw, self.optimizer, path)
        else:
            meta = st.read_mgpu_checkpoint(path)
            st.load_model_state(self.wrapped.raw, meta["model"], str(path))
            st.load_optimizer_state(self.wrapped.raw, self.optimizer, meta["optimizer"])
        self._restore(meta, path)

    def _restore(self, ckpt: dict[str, Any], path: Path) -> None:
        """Everything but the weights: schedules, counters, and each rank's loader position and RNG."""
        if self.scheduler is not None and ckpt.get("scheduler") is not None:
            self.scheduler.load_state_dict(ckpt["scheduler"])
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.step, self.epoch, self.best = ckpt["step"], ckpt["epoch"], ckpt.get("best")
        changed = st.recipe_changes(ckpt.get("recipe", ""), OmegaConf.to_yaml(self.cfg, resolve=True))
        if changed:
            self.reporter.warn(f"the recipe changed since {path} was saved: {', '.join(changed)}")
        same_world = ckpt.get("world_size") == self.rt.world_size
        per_rank = ckpt.get("per_rank") or []
        mine = per_rank[self.rt.rank] if same_world and self.rt.rank < len(per_rank) else None
        if ckpt.get("mid_epoch") and not same_world:
            self.reporter.warn(f"{path} was saved mid-epoch by {ckpt.get('world_size')} process(es); with "
                               f"{self.rt.world_size} the loader position cannot carry over, so epoch "
                               f"{self.epoch} restarts from its beginning.")
        self._pending = {"loader": mine["loader"] if mine and ckpt.get("mid_epoch") else None,
                         "rng": mine["rng"] if mine else None}
        self.reporter.message(f"resumed from {path} (epoch {self.epoch}, step {self.step})")

    def save(self, mid_epoch: bool, best: bool = False) -> None:
        """Every rank joins (state dicts are collective under FSDP); rank 0 writes atomically."""
        self._check_finite()
        with self.progress.in_phase("checkpoint: gathering state from every rank"):
            if not self._sharded:
                model = st.model_state(self.wrapped.raw)
                optim = st.optimizer_state(self.wrapped.raw, self.optimizer)
            mine = {"rng": st.capture_rng(self.rt.device),
                    "loader": self.loaders.train.state_dict() if mid_epoch else None}
            per_rank = dist_rt.all_gather_objects(mine, self.rt)
        meta = st.build_payload(
            scheduler=self.scheduler.state_dict() if self.scheduler is not None else None,
            scaler=self.scaler.state_dict() if self.scaler is not None else None,
            epoch=self.epoch, step=self.step, mid_epoch=mid_epoch, per_rank=per_rank,
            world_size=self.rt.world_size, recipe=OmegaConf.to_yaml(self.cfg, resolve=True),
            metrics=self.last_val, best=self.best, best_metric=self.tcfg.best_metric,
        )
        ckpts = checkpoint_dir(self.run_dir)
        if self._sharded:
            with self.progress.in_phase("checkpoint: writing shards"):
                save_sharded(self.wrapped.raw, self.optimizer, meta, ckpts, self.step, self.rt,
                             self.tcfg.keep_checkpoints, best)
            return
        if not self.rt.is_main:
            return
        save_atomic({**meta, "model": model, "optimizer": optim}, ckpts / "last.pt", step=self.step)
        if best:
            copy_atomic(ckpts / "last.pt", ckpts / "best.pt")
        if self.tcfg.keep_checkpoints > 0:
            copy_atomic(ckpts / "last.pt", ckpts / f"step-{self.step:08d}.pt")
            for old in sorted(ckpts.glob("step-*.pt"))[: -self.tcfg.keep_checkpoints]:
                old.unlink(missing_ok=True)

    def _maybe_best(self, val: dict[str, Any] | None) -> bool:
        name = self.tcfg.best_metric
        if not name or not val or name not in val:
            return False
        mode = self.tcfg.best_mode
        if mode == "auto":
            mode = "min" if any(w in name for w in ("loss", "perplexity", "mse", "mae", "error")) else "max"
        value = float(val[name])
        better = self.best is None or (value < self.best if mode == "min" else value > self.best)
        if better:
            self.best = value
        return better

    # ------------------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train for ``trainer.epochs`` (or until ``trainer.max_steps``); returns the final metrics.

        SIGTERM/SIGINT/SIGUSR1 request a stop; the ranks agree on it when the next log-interval reduction
        is read (so within ``trainer.log_every`` + 1 steps), save a checkpoint there and raise Preempted. A
        second SIGINT interrupts at once.
        """
        steps_per_epoch = math.ceil(len(self.loaders.train) / self.tcfg.grad_accum)
        self.reporter.start(self._info(steps_per_epoch))
        total_epochs = self.tcfg.epochs if self.tcfg.max_steps is None else max(
            self.tcfg.epochs, math.ceil(self.tcfg.max_steps / steps_per_epoch))
        train_metrics = None
        with self._stop_signals(), self._tag_failures():
            while self.epoch < total_epochs and not self._done():
                finished_epoch = self.epoch
                train_metrics = self.train_epoch(steps_per_epoch)
                if self.stop_agreed and self._mid_epoch:
                    self._preempt(mid_epoch=True)
                val, saved = self._end_epoch(total_epochs)
                self.reporter.epoch_end(finished_epoch, train_metrics, val)
                if self.stop_agreed:
                    self._preempt(mid_epoch=False, saved=saved)
        return {"step": self.step, "epoch": self.epoch, "train": train_metrics, "val": self.last_val,
                "run_dir": str(self.run_dir)}

    def _end_epoch(self, total_epochs: int) -> tuple[dict[str, Any] | None, bool]:
        """Validate and checkpoint after an epoch (or after max_steps mid-epoch); returns (val, saved)."""
        tcfg = self.tcfg
        ended_early = self._done() and self._mid_epoch
        if not ended_early:
            self.epoch += 1
        last = self._done() or self.epoch >= total_epochs
        val = None
        if self.loaders.val is not None and tcfg.val_every and (self.epoch % tcfg.val_every == 0 or last):
            val = self.evaluate()
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
            f"(epoch {self.epoch}); every rank agreed on that step and the checkpoint "
            f"in {checkpoint_dir(self.run_dir)} is complete.",
            "Continue the run with the same command plus --resume auto.",
        )

    def _done(self) -> bool:
        return self.hot.max_steps is not None and self.step >= self.hot.max_steps

    def train_epoch(self, steps_per_epoch: int) -> dict[str, Any] | None:
        """One pass over this rank's shard (from the saved position when resuming mid-epoch)."""
        hot, loader = self.hot, self.loaders.train
        self.loaders.sampler.set_epoch(self.epoch)
        pending, self._pending = self._pending, None
        if pending and pending["loader"] is not None:
            loader.load_state_dict(pending["loader"])
        batches = iter(loader)  # building the iterator draws from the RNG: restore RNG after it
        if pending and pending["rng"] is not None:
            st.restore_rng(pending["rng"], self.rt.device)
        done_in_epoch = self.step - self.epoch * steps_per_epoch
        self.reporter.epoch_start(self.epoch, steps_per_epoch, max(0, done_in_epoch))
        self.wrapped.train.train()
        self._mid_epoch = True
        metrics = None
        self._interval_start, self._interval_steps = time.perf_counter(), 0
        micro = 0
        for batch in batches:
            micro += 1
            final = micro == hot.grad_accum
            self._forward_backward(batch, sync=final)
            if final:
                micro = 0
                metrics = self._optimizer_step() or metrics
                if self.stop_agreed or self._done():  # every rank stops at the same step
                    return self._reduce_and_log() or metrics
        if micro:  # a partial accumulation at the end of the epoch still makes a step
            metrics = self._optimizer_step() or metrics
        self._mid_epoch = False
        metrics = self._reduce_and_log() or metrics
        if self.scheduler is not None and hot.scheduler_interval == "epoch":
            self.scheduler.step()
        return metrics

    def _forward_backward(self, batch, sync: bool) -> None:
        inputs, targets = to_device(batch, self.rt.device, non_blocking=self._non_blocking)
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
        if len(self._losses) >= _FOLD_EVERY:
            self._fold()
        scaled = loss if self.hot.grad_accum == 1 else loss / self.hot.grad_accum
        self.progress.phase = self._backward_phase if sync else "backward"
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()

    def _optimizer_step(self) -> dict[str, Any] | None:
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
        metrics = self._finish_reduction() if self._in_flight is not None else None  # started a step ago
        if self.step % hot.log_every == 0:
            self._start_reduction()
        if hot.checkpoint_every_steps and self.step % hot.checkpoint_every_steps == 0 and not self._done():
            metrics = self._finish_reduction() or metrics
            self.save(mid_epoch=True)
        return metrics

    # ------------------------------------------------------------------------------ metrics and flags
    def _reduce_and_log(self) -> dict[str, Any] | None:
        """Every interval reduced and logged, now: the one in flight, then the steps since (at the end of an
        epoch, and when every rank stops). Returns the latest train metrics (None if there were none)."""
        metrics = self._finish_reduction()
        if self._interval_steps:
            self._start_reduction()
            metrics = self._finish_reduction()
        return metrics

    def _start_reduction(self) -> None:
        """Start the one collective of a log interval: the metric sums, the interval's loss total (the NaN
        check) and the stop flag, in one vector made with as few ops as possible (see _sum_column).

        The all-reduce runs while the next step computes, and that step finishes it (_finish_reduction): a
        blocking one costs its whole latency on the interval's step (~0.35 ms on 2 gloo processes here, a
        quarter of the MLP recipe's step). Every rank finishes it at the same step, so they still agree on
        where to stop, and a save, the end of an epoch or a stop finishes it first."""
        device = self.rt.device
        # Float32 losses summed in float64 cannot overflow: the total is NaN/inf exactly when one loss was, on
        # any rank once all-reduced (which step: only worked out when one was).
        losses = torch.stack(self._losses).sum(dtype=torch.float64) if self._losses else _constant(0.0, device)
        if self._bad_folded:  # a fold earlier in this interval (> _FOLD_EVERY micro-steps) checked some already
            losses = torch.where(self.first_bad < _NO_BAD, float("nan"), losses)
            self._bad_folded = False  # this reduction carries first_bad's verdict; a later fold sets it again
        flags = [losses, _constant(float(self.signal_received is not None), device)]
        if self._acc_dirty or not self._step_rows:
            self._fold_rows()
            vec = torch.cat([self.acc, torch.stack(flags)])
            self.acc.zero_()
            self._acc_dirty = False
        else:  # the usual interval: the pieces' column sums and the flags, stacked at once
            vec = _float64_vector([*column_sums(self._step_rows, device), *flags])
            self._step_rows.clear()
        work = dist_rt.all_reduce_sum(vec, self.rt, async_op=True)
        now = time.perf_counter()
        elapsed = now - self._interval_start
        self._in_flight = _Reduction(vec, work, self._losses, self._loss_steps, self.step, self.epoch, elapsed,
                                     self.optimizer.param_groups[0]["lr"], time.time())
        self._losses, self._loss_steps = [], []
        self._interval_start, self._interval_steps = now, 0

    def _finish_reduction(self) -> dict[str, Any] | None:
        """Wait for the interval's all-reduce (if one is in flight), stop on a non-finite loss, take the stop
        flag, and log the interval's record."""
        done, self._in_flight = self._in_flight, None
        if done is None:
            return None
        with self.progress.in_phase("log interval: metrics/NaN/stop all-reduce"):
            if done.work is not None:
                done.work.wait()
            vec = done.vec.tolist()
        sums, loss_total, stop = vec[:-2], vec[-2], vec[-1]
        if not math.isfinite(loss_total):
            self._losses[:0], self._loss_steps[:0] = done.losses, done.loss_steps
            self._fold()  # every rank: finds its first non-finite step, then they agree on the earliest
            self._raise_nan()
        self.stop_agreed = self.stop_agreed or stop > 0
        metrics = self.task.metrics(sums)
        samples = sums[self.task.stat_names.index("samples")] if "samples" in self.task.stat_names else 0
        self._emit({"split": "train", "step": done.step, "epoch": done.epoch, **metrics,
                    "samples_per_s": samples / done.elapsed if done.elapsed > 0 else 0.0, "lr": done.lr,
                    "time": done.time})
        return metrics

    def _fold(self) -> None:
        """Fold the pending step pieces into ``acc`` and the pending losses into ``first_bad``, on the device:
        a few ops per interval, no host sync (host numbers go host-to-device without blocking)."""
        self._fold_rows()
        if not self._losses:
            return
        finite = torch.isfinite(torch.stack(self._losses))
        steps = _to(torch.tensor(self._loss_steps, dtype=torch.int64), self.rt.device)
        self.first_bad = torch.minimum(self.first_bad, torch.where(finite, _NO_BAD, steps).min())
        self._bad_folded = True
        self._losses.clear()
        self._loss_steps.clear()

    def _fold_rows(self) -> None:
        """Add the pending step pieces (see Task.step_stats) into ``acc``."""
        if self._step_rows:
            self.acc += sum_step_rows(self._step_rows, self.rt.device)
            self._acc_dirty = True
            self._step_rows.clear()

    def _check_finite(self) -> None:
        """Before a save: all ranks agree that no step so far produced a non-finite loss."""
        self._finish_reduction()
        self._fold()
        with self.progress.in_phase("checkpoint: NaN check all-reduce"):
            flag = dist_rt.all_reduce_sum((self.first_bad < _NO_BAD).to(torch.float64).reshape(1), self.rt)
        if flag.item():
            self._raise_nan()
        self._bad_folded = False

    def _raise_nan(self) -> None:
        first = self.first_bad.clone()
        if self.rt.distributed:
            torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN)
        raise JobFailed(
            f"the loss became NaN or inf at step {int(first.item())}; the run stopped without saving that state.",
            "Lower optim.lr, set trainer.clip_grad_norm (e.g. 1.0), or use precision bf16/fp32 instead of fp16; "
            "then resume from the last checkpoint with --resume auto.",
            retryable=False,  # a restart from the last checkpoint replays the same steps
        )

    def _emit(self, record: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write(record)
        self.reporter.log(record)

    def evaluate(self) -> dict[str, Any]:
        """Exact validation (see engine.evaluate); recorded in metrics.jsonl and kept for the checkpoint."""
        with self.progress.in_phase("validation"):
            self.last_val = evaluate_exact(self.wrapped.eval, self.loaders.val, self.loaders.val_batches,
                                           self.task, self.rt, self.autocast_dtype, lockstep=self.wrapped.is_fsdp)
        self._emit({"split": "val", "step": self.step, "epoch": self.epoch, **self.last_val, "time": time.time()})
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
