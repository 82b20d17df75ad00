"""The Trainer: the loop of a run, the same on 1 or N processes.

Its parts are built by :mod:`~mgpucli.engine.build`, and each has one job: :mod:`~mgpucli.engine.log_interval`
(training metrics as device sums, one collective per log interval, the ranks' agreement on a stop or a non-finite
loss), :mod:`~mgpucli.engine.checkpoints.training` (the run dir, saving and restoring),
:mod:`~mgpucli.engine.run_outputs` (metrics.jsonl, TensorBoard, the experiment trackers, the reporter),
:mod:`~mgpucli.engine.stop_requests` (signals), the strategy's wrapped model (:mod:`~mgpucli.engine.strategy`), and
the optional ones, each off unless its recipe section is there: :mod:`~mgpucli.engine.ema`,
:mod:`~mgpucli.engine.early_stopping`, :mod:`~mgpucli.engine.profiling`. What is left here is the loop: epochs,
the step (:meth:`Trainer.train_step`), validation, and when to save; with ``probe=True`` only the set-up, for
:mod:`~mgpucli.engine.probe` to time steps without a run dir.

The step path's rules: no host sync per step (metrics stay on the device until the log interval), one collective
per log interval beside the gradients' own, ``no_sync`` on the micro-steps of an accumulation but its last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mgpucli import batch_layout, faults
from mgpucli.batch_layout import Layout
from mgpucli.distributed import collectives
from mgpucli.distributed.heartbeat import Heartbeat
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine import clear_errors
from mgpucli.engine.anatomy import StepClock, StragglerWatch
from mgpucli.engine.build import build_run
from mgpucli.engine.checkpoints import state as engine_state
from mgpucli.engine.checkpoints.training import Checkpoints, Position, Resumed
from mgpucli.engine.data import channels_last, samples_consumed, to_device
from mgpucli.engine.evaluate import evaluate_exact
from mgpucli.engine.log_interval import LogInterval
from mgpucli.engine.profiling import ProfileWindow, window_for
from mgpucli.engine.reporter import Reporter
from mgpucli.engine.run_outputs import RunOutputs
from mgpucli.engine.stop_requests import StopRequests
from mgpucli.engine.tasks import forward_batch_of
from mgpucli.errors import Preempted
from mgpucli.run_files import checkpoint_dir, saved_checkpoint


class Trainer:
    """One worker's training run. Build with a validated recipe and a Runtime, call ``setup()``, then ``fit()``."""

    def __init__(self, cfg: DictConfig, runtime: Runtime, reporter: Reporter, resume: str | None = None,
                 overwrite: bool = False, source: str = "the recipe", probe: bool = False,
                 pinned: frozenset[str] = frozenset()):
        self.cfg, self.runtime, self.reporter = cfg, runtime, reporter
        self.source = source  # the recipe as the user named it, for problems found while building
        self.resume, self.overwrite = resume, overwrite
        self.probe = probe  # only measure (engine/probe.py): no run dir, no records, no checkpoints
        self.pinned = pinned  # batch settings given on the command line (mgpucli.batch_layout.PINNED_KEYS)
        self.position = Position()
        self.stop = StopRequests()
        self.outputs = RunOutputs(reporter)  # metrics.jsonl, TensorBoard and trackers (rank 0), the reporter
        self.heartbeat: Heartbeat | None = None
        self.profile: ProfileWindow | None = None
        self._resumed: Resumed | None = None  # applied when the epoch's loader iterator exists
        self._mid_epoch = False
        self._stop_before_save: bool | None = None  # at this rank's last save: a stop was requested by then
        self._batches_taken = 0  # this epoch's, on each rank, since the sampler's start
        # An elastic job (mgpu launch --nnodes MIN:MAX): the global batch it keeps over its node range, whatever the
        # command line pins; and where this rank's last optimizer step left the epoch, for a lost peer (rescue()).
        self.elastic_batch = batch_layout.elastic_global_batch(os.environ)
        if self.elastic_batch is not None:
            self.pinned = frozenset()
        self._done_batches: int | None = None  # batches taken by this rank's last optimizer step (None: none yet)
        self._at_epoch_end = False  # since then, the epoch ended (position.epoch counts it)

    @property
    def step(self) -> int:
        return self.position.step

    # ----------------------------------------------------------------------------------------- setup
    def setup(self) -> None:
        """The checkpoint to resume and the global batch it keeps, every part built (engine/build.py), the run dir
        taken, the checkpoint loaded."""
        runtime = self.runtime
        self.heartbeat = Heartbeat(runtime.rank, runtime.world_size)  # where each rank is, for timeout messages
        self.heartbeat.start()
        self.checkpoints = Checkpoints(self.cfg, runtime, self.heartbeat, self.reporter)
        self.checkpoints.stop_requested = lambda: self.stop.received is not None
        # Read before the run dir is touched: a checkpoint that doesn't fit leaves it as it was.
        found = None if self.probe else self.checkpoints.check_run_dir(self.resume, self.overwrite)
        if found is not None:
            self._keep_global_batch(found)
        elif self.elastic_batch is not None and not self.probe:  # a fresh start on the nodes here
            self._use_layout(batch_layout.elastic_start(self.elastic_batch, runtime.world_size,
                                                        int(self.cfg.data.batch_size),
                                                        int(self.cfg.trainer.grad_accum)))
        built = build_run(self.cfg, runtime, self.heartbeat, self.reporter, self.source)
        self.cfg, self.task, self.loaders, self.trained = built.cfg, built.task, built.loaders, built.trained
        self._forward_batch = forward_batch_of(self.task)
        self.settings, self.total_steps, self.autocast_dtype = built.settings, built.total_steps, built.autocast_dtype
        anatomy = self.cfg.trainer.anatomy or self.probe
        self.clock = StepClock.for_device(runtime.device) if anatomy else None
        if self.clock is not None and runtime.distributed and self.trained.model.is_ddp:
            self.clock.watch_gradients(self.trained.model.raw)
        # the probe reads the clock itself, over its timed steps (engine/probe.py)
        self.intervals = LogInterval(self.task, runtime, self.heartbeat, self.outputs.emit,
                                     None if self.probe else self.clock)
        if self.clock is not None and runtime.world_size > 1 and runtime.is_main and not self.probe:
            self.outputs.stragglers = StragglerWatch(self.loaders.num_workers, self.cfg.data.pin_memory,
                                                     runtime.device.type)
        self.checkpoints.use(self.cfg, Layout(runtime.world_size, int(self.cfg.data.batch_size),
                                              self.settings.grad_accum), self._nodes())
        self._backward_phase = ("backward (gradient all-reduce)" if runtime.distributed
                                and self.trained.model.strategy in ("ddp", "fsdp") else "backward")
        self._faults = faults.enabled()
        if self.probe:  # the run dir stays as it is: nothing taken, created or written, nothing loaded or saved
            self.intervals.emit = lambda record: None
            self.settings = dataclasses.replace(self.settings, checkpoint_every_steps=None)
        else:
            self._take_run_dir(found)
        engine_state.seed_everything(self.cfg.seed + 1000 * runtime.rank + self.step)  # per-rank randomness

    def _keep_global_batch(self, found) -> None:
        """Resuming: train on the checkpoint's global batch (``trainer.grad_accum`` changed to keep it on another
        process count), unless the command line sets the batch (mgpucli/batch_layout.py)."""
        batch, accum = int(self.cfg.data.batch_size), int(self.cfg.trainer.grad_accum)
        self._use_layout(self.checkpoints.resolve_layout(found, batch, accum, self.pinned))

    def _use_layout(self, kept: batch_layout.Resolution) -> None:
        """Train on ``kept``'s layout (its ``trainer.grad_accum``), saying why it changed."""
        if kept.note:
            self.reporter.message(kept.note)
        if kept.warning:
            self.reporter.warn(kept.warning)
        if kept.layout.grad_accum != int(self.cfg.trainer.grad_accum):
            self.cfg = OmegaConf.merge(self.cfg, {"trainer": {"grad_accum": kept.layout.grad_accum}})

    def _nodes(self) -> int | None:
        """On how many nodes this run trains, for its segments: recorded for a job of several nodes or an elastic
        one (None: one node)."""
        env = self.runtime.env
        nodes = env.world_size // env.local_world_size if env.local_world_size else 1
        return nodes if nodes > 1 or self.elastic_batch is not None else None

    def _take_run_dir(self, found) -> None:
        """Load the checkpoint to resume from (``found``, None: a fresh start), then take the run dir (rank 0), open
        its records and the profiler window."""
        if found is not None:
            self._resumed = self.checkpoints.load(found, self.trained, self.position)
            sums = self._resumed.epoch_sums
            if sums is not None and len(sums) == len(self.task.stat_names):
                self.intervals.epoch_sums = sums
        self.checkpoints.take_run_dir(self.overwrite)
        run_dir = self.checkpoints.run_dir
        self.profile = window_for(self.cfg.trainer.profile, self.total_steps, run_dir, self.runtime, self.reporter)
        runtime = self.runtime
        tags = {"world_size": str(runtime.world_size), "device": runtime.device.type,
                "strategy": self.trained.model.strategy}
        self.outputs.open(self.cfg, run_dir, runtime, tags, self.step if found is not None else None,
                          self._resumed.trackers if self._resumed is not None else None)
        self.checkpoints.tracker_ids = self.outputs.tracker_ids  # their run ids go into every checkpoint
        segment = self.checkpoints.segments[-1]
        if segment.first_step == self.step + 1 and (found is not None or self.elastic_batch is not None):
            self.outputs.write({"split": "event", "event": "segment", **segment.record(), "step": self.step,
                                "time": time.time()})  # where this stretch of the run trains, from the next step

    def started_details(self) -> dict[str, Any]:
        """What the launcher's line about a restart says: the step training starts after, and on what layout."""
        return {"step": self.step, **self.checkpoints.segments[-1].record(), "strategy": self.trained.model.strategy}

    # ------------------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train for ``trainer.epochs`` (or until ``trainer.max_steps``); returns the final metrics.

        SIGTERM/SIGINT/SIGUSR1 request a stop; the ranks agree on it when the next log-interval reduction is read
        (within ``trainer.log_every`` + 1 steps), save a checkpoint there and raise Preempted. A stop requested after
        the last step, before the final checkpoint is complete, raises Preempted too (:meth:`_finish`); one that
        comes later only waits for the teardown.
        """
        settings = self.settings
        steps_per_epoch = math.ceil(len(self.loaders.train) / settings.grad_accum)
        total_epochs = settings.epochs if settings.max_steps is None else max(
            settings.epochs, math.ceil(settings.max_steps / steps_per_epoch))
        self.reporter.start({**self._info(steps_per_epoch), "total_epochs": total_epochs})
        train_metrics = None
        stopping = self.trained.early_stopping
        if stopping is not None and stopping.should_stop:  # resumed from a run that had stopped early
            self.reporter.message(f"{stopping.reason()}: the run stopped at step {self.step}; nothing left to train.")
        with self.stop.listening(), self._tag_failures(), self._profiling():
            while self.position.epoch < total_epochs and not self._done() and not self._stopped_early():
                number = self.position.epoch + 1  # epochs are numbered from 1 in everything a user reads
                train_metrics = self.train_epoch(steps_per_epoch)
                if self.intervals.stop_agreed and self._mid_epoch:
                    self._preempt(mid_epoch=True)
                val, saved = self._end_epoch(total_epochs)
                self.reporter.epoch_end(number, train_metrics, val)
                if self._stopped_early():  # every rank validated alike: all stop here, after saving
                    self._record_early_stop()
                elif self.intervals.stop_agreed:
                    self._preempt(mid_epoch=False, saved=saved)
            self._finish()
        return {"step": self.step, "epoch": self.position.epoch, "train": train_metrics,
                "val": self.position.last_val, "run_dir": str(self.checkpoints.run_dir),
                "stopped_early": stopping.reason() if self._stopped_early() else None}

    def train_epoch(self, steps_per_epoch: int) -> dict[str, Any] | None:
        """One pass over this rank's shard (from the saved position when resuming mid-epoch); returns the epoch's
        train metrics: means over all its samples (None if it had none)."""
        position, loader = self.position, self.loaders.train
        self.loaders.sampler.set_epoch(position.epoch)
        resumed, self._resumed = self._resumed, None
        self._batches_taken = 0
        if resumed is not None and resumed.epoch_start is not None:  # mid-epoch: where the epoch's order goes on
            self.loaders.sampler.resume_at(position.epoch, resumed.epoch_start)
        if resumed is not None and resumed.loader is not None:
            loader.load_state_dict(resumed.loader)  # the same process count: this rank's own loader position
            self._batches_taken = resumed.batches_taken
        # Building the iterator draws from the RNG. A checkpoint saved at an epoch's end holds the RNG before the next
        # epoch's draw: restored before it. One saved mid-epoch holds it after its epoch's draw: restored after it.
        rng = resumed.rng if resumed is not None else None
        at_epoch_start = resumed is None or (resumed.loader is None and resumed.epoch_start is None)
        if at_epoch_start:
            self.intervals.new_epoch()  # else the epoch's sums came with the checkpoint
            if rng is not None:
                engine_state.restore_rng(rng, self.runtime.device)
        batches = iter(loader)
        if rng is not None and not at_epoch_start:
            engine_state.restore_rng(rng, self.runtime.device)
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
        self.heartbeat.phase = "loading a batch"  # an attribute set: what a rank stalled here was doing
        batch = self._next_batch(batches)
        if batch is None:
            return False
        self._batches_taken += 1
        if self.profile is not None:
            self.profile.before_step(self.step + 1)
        for micro in range(1, self.settings.grad_accum + 1):
            following = self._next_batch(batches) if micro < self.settings.grad_accum else None
            started = self.clock.mark() if self.clock is not None else None
            self._forward_backward(batch, sync=following is None)
            if self.clock is not None:
                self.clock.add_backward(started, self.clock.mark(), communicated=following is None)
            if following is None:
                break
            self._batches_taken += 1
            batch = following
        self._optimizer_step()
        if self.profile is not None:
            self.profile.after_step(self.step)
        return True

    def _next_batch(self, batches: Iterator):
        """The next batch (None at the end), its wait timed for the step anatomy (when on: no clock read when off)."""
        if self.clock is None:
            return next(batches, None)
        started = time.perf_counter()
        batch = next(batches, None)
        self.clock.add_data(time.perf_counter() - started)
        return batch

    def _forward_backward(self, batch, sync: bool) -> None:
        model, runtime = self.trained.model, self.runtime
        if runtime.device.type != "cpu":  # a CPU loader's batch is where a CPU run computes: no move to make
            batch = to_device(batch, runtime.device, non_blocking=runtime.device.type == "cuda")
        if self.settings.channels_last:
            batch = channels_last(batch)
        step = self.step + 1
        self.heartbeat.step, self.heartbeat.phase = step, "forward"
        if model.is_fsdp and self.settings.grad_accum > 1:  # FSDP2's no_sync: reduce-scatter on the last only
            model.train.set_requires_gradient_sync(sync)
        # DDP decides in forward whether backward all-reduces: not on the micro-steps before the last.
        if model.is_ddp and not sync:
            with model.train.no_sync():
                self._compute(batch, step, sync)
        else:  # no context manager where it would do nothing: each costs microseconds a short step notices
            self._compute(batch, step, sync)

    def _compute(self, batch, step: int, sync: bool) -> None:
        """Forward (under autocast when the precision asks for it), the loss and its bookkeeping, backward."""
        model = self.trained.model
        if self.autocast_dtype is None:
            outputs, targets = self._forward_batch(model.train, batch)
            loss = self.task.loss(outputs, targets)
        else:
            with torch.autocast(self.runtime.device.type, dtype=self.autocast_dtype):
                outputs, targets = self._forward_batch(model.train, batch)
                loss = self.task.loss(outputs, targets)
        if self._faults:  # test-only: a held step, a crash, a stuck rank, a NaN
            faults.hold("hold_step", lambda: self.stop.received is not None, self.runtime.rank, step)
            if faults.maybe_fault("step", self.runtime.rank, step):
                loss = loss * float("nan")
        detached = loss.detach()
        self.intervals.add_step(outputs, targets, detached, step)
        scaled = loss / self.settings.grad_accum if self.settings.grad_accum > 1 else loss
        self.heartbeat.phase = self._backward_phase if sync else "backward"
        scaler = self.trained.scaler
        (scaler.scale(scaled) if scaler is not None else scaled).backward()

    def _optimizer_step(self) -> None:
        settings, trained, position = self.settings, self.trained, self.position
        optimizer, scaler = trained.optimizer, trained.scaler
        started = self.clock.mark() if self.clock is not None else None
        if settings.clip_grad_norm is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trained.model.raw.parameters(), settings.clip_grad_norm)
        self.heartbeat.phase = "optimizer step"
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if trained.scheduler is not None and settings.scheduler_interval == "step":
            trained.scheduler.step()
        if self.clock is not None:
            self.clock.add_optimizer(started, self.clock.mark())
        position.step += 1
        self._done_batches, self._at_epoch_end = self._batches_taken, False  # a step every rank completed
        if trained.ema is not None:
            trained.ema.update(position.step)
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
            self._at_epoch_end = True
        last = self._done() or position.epoch >= total_epochs
        val = None
        if self.loaders.val is not None and settings.val_every and (position.epoch % settings.val_every == 0 or last):
            val = self.evaluate(number)
        stopping = self.trained.early_stopping
        if stopping is not None and val is not None:
            last = stopping.observe(val, position.step) or last  # a last checkpoint, with the verdict in it
        improved = self.checkpoints.improves_best(val)
        saved = last or (settings.checkpoint_every and position.epoch % settings.checkpoint_every == 0) or improved
        if saved:
            if last and self._faults:  # test-only: hold here, after the last step, until a signal comes
                faults.hold("hold_last_save", lambda: self.stop.received is not None, self.runtime.rank)
            self.save(mid_epoch=ended_early, best=improved)
        return val, bool(saved)

    def save(self, mid_epoch: bool, best: bool = False) -> None:
        """Record every step so far (which also checks them all for a non-finite loss), then checkpoint."""
        self._flush()
        data_position = None
        if mid_epoch:
            sampler = self.loaders.sampler
            data_position = {"skipped": sampler.skipped, "consumed": samples_consumed(
                sampler, self._batches_taken, int(self.cfg.data.batch_size))}
        self.checkpoints.save(self.trained, self.position, self.intervals.epoch_sums, data_position, best,
                              written=self._note_saved)

    def _note_saved(self) -> None:
        """This rank's part of a save is done (rank 0: the checkpoint becomes complete): was a stop requested by
        then?"""
        self._stop_before_save = self.stop.received is not None

    def _flush(self) -> None:
        self.intervals.flush(self.step, self.position.epoch + 1, self._lr(), self.stop.received is not None)

    def _preempt(self, mid_epoch: bool, saved: bool = False) -> None:
        if not saved:
            self.save(mid_epoch=mid_epoch)
        self.checkpoints.wait()  # a save in the background (trainer.async_save) is complete before the exit
        # Before the ranks meet to leave (engine/run.py): a rank that exited 75 first would have torch's agent
        # SIGTERM rank 0 while its trackers finish.
        self.finish_tracking("preempted")
        epoch = self.position.epoch + 1 if mid_epoch else self.position.epoch
        raise Preempted(
            f"stopped by {self.stop.received or 'a signal on another rank'} at step {self.step} (epoch {epoch}); "
            f"every rank agreed on that step and the checkpoint in {checkpoint_dir(self.checkpoints.run_dir)} is "
            "complete.",
            "Continue the run with the same command plus --resume auto.",
            step=self.step, signal=self.stop.received,
        )

    def _finish(self) -> None:
        """The run's last checkpoint is written: the ranks agree once more. A stop requested on any rank before it
        was complete (as each rank saw its save end, :meth:`_note_saved`; rank 0's ends with the write) still ends the
        run as preempted (exit 75; the checkpoint holds the last step). Otherwise the run has finished, and a signal
        from now on only waits for the teardown (:meth:`StopRequests.finish`)."""
        self.checkpoints.wait()  # the final save, if written in the background (trainer.async_save), is complete
        before = self._stop_before_save if self._stop_before_save is not None else self.stop.received is not None
        asked = torch.tensor([float(before)], dtype=torch.float64, device=self.runtime.device)
        with self.heartbeat.in_phase("end of the run: stop all-reduce"):
            collectives.all_reduce_sum(asked, self.runtime)
            stop = asked.item() > 0
        if stop:
            self._preempt(mid_epoch=self._mid_epoch, saved=True)
        self.stop.finish()

    def _stopped_early(self) -> bool:
        return self.trained.early_stopping is not None and self.trained.early_stopping.should_stop

    def _record_early_stop(self) -> None:
        """The run's closing record (metrics.jsonl) and line: why it stopped."""
        stopping = self.trained.early_stopping
        self.outputs.write(stopping.record(self.step, self.position.epoch, time.time()))
        self.reporter.message(f"{stopping.reason()}. Stopped after epoch {self.position.epoch}, step {self.step}; "
                              f"the checkpoint in {checkpoint_dir(self.checkpoints.run_dir)} holds that step.")

    def _done(self) -> bool:
        return self.settings.max_steps is not None and self.step >= self.settings.max_steps

    def _lr(self) -> float:
        return self.trained.optimizer.param_groups[0]["lr"]

    @contextlib.contextmanager
    def _profiling(self):
        """A profiler window still open when the loop ends (the run ended or stopped inside it) writes its trace."""
        try:
            yield
        finally:
            if self.profile is not None:
                self.profile.close()

    @contextlib.contextmanager
    def _tag_failures(self):
        """Tag escaping errors with the step, so `mgpu launch` can tell a failure that repeats from a new one."""
        try:
            yield
        except Exception as err:
            err.mgpu_step = self.step + 1
            self.rescue(err)
            raise

    def rescue(self, err: Exception) -> None:
        """An elastic job's rank whose collective failed (a peer lost): keep the last step every rank completed as
        ``last.pt``, so that the restart on the nodes still there loses no step (see
        :mod:`mgpucli.engine.checkpoints.rescue` for what that guarantees and when it is not written). Said in this
        rank's log; a rescue that fails leaves the error that ended the run as it is."""
        if self.elastic_batch is None or self._done_batches is None or not clear_errors.is_collective_failure(err):
            return
        rank = self.runtime.rank
        why = self._no_rescue()
        try:
            wrote = why is None and self.checkpoints.save_alone(self.trained, self.position, self.intervals.epoch_sums,
                                                                self._rescue_position())
        except Exception as failed:  # noqa: BLE001 - the run's own error is the one to report
            why = f"writing it failed ({type(failed).__name__}: {failed})"
            wrote = False
        where = saved_checkpoint(self.checkpoints.run_dir)
        said = (f"kept step {self.step}, the last step every rank completed, in {where}" if wrote else
                f"did not keep step {self.step}: {why or 'a survivor already kept it (or a later one)'}")
        print(f"mgpu: rank {rank} lost its connection to another rank; {said}.", file=sys.stderr, flush=True)

    def _no_rescue(self) -> str | None:
        """Why this rank cannot keep its state as the last step every rank completed (None: it can)."""
        if self.trained.model.is_fsdp:
            return "under FSDP each rank holds only its shards, and the lost node's are gone; the restart continues " \
                   "from the latest checkpoint"
        if self.checkpoints.sharded_format:
            return ("sharded checkpoints (trainer.checkpoint_format) need every rank; the restart continues from the "
                    "latest checkpoint")
        if self.heartbeat.phase == "optimizer step":
            return "the failure came inside an optimizer step"
        if not all(bool(torch.isfinite(p).all()) for p in self.trained.model.raw.parameters()):
            return "its weights hold a non-finite value (a NaN not yet checked); the latest checkpoint is the last good"
        return None

    def _rescue_position(self) -> dict[str, int] | None:
        """The data position after this rank's last optimizer step (None: at an epoch's end)."""
        if self._at_epoch_end:
            return None
        sampler = self.loaders.sampler
        return {"skipped": sampler.skipped,
                "consumed": samples_consumed(sampler, self._done_batches or 0, int(self.cfg.data.batch_size))}

    # ------------------------------------------------------------------------------------ validation
    def evaluate(self, epoch: int) -> dict[str, Any]:
        """Exact validation (see engine.evaluate) after ``epoch`` (numbered from 1); recorded in metrics.jsonl and
        kept for the checkpoint."""
        model, ema = self.trained.model, self.trained.ema
        on_ema = ema is not None and ema.validate
        if model.is_ddp and self.cfg.trainer.ddp.broadcast_buffers:
            # DDP gives every rank rank 0's buffers at the start of a training forward, and each rank's own forward
            # then moves its BatchNorm statistics on: the checkpoint holds rank 0's, so every rank validates with them
            with self.heartbeat.in_phase("validation: buffer broadcast"):
                collectives.broadcast_buffers(model.raw, self.runtime)
        with self.heartbeat.in_phase("validation"), ema.swapped_in() if on_ema else contextlib.nullcontext():
            val = evaluate_exact(model.eval, self.loaders.val, self.loaders.val_batches, self.task, self.runtime,
                                 self.autocast_dtype, lockstep=model.is_fsdp)
        if ema is not None:  # which weights were validated, where a run has both
            val["weights"] = "ema" if on_ema else "model"
        self.position.last_val = val
        self.outputs.emit({"split": "val", "step": self.step, "epoch": epoch, **val, "time": time.time()})
        return val

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

    def finish_tracking(self, status: str) -> None:
        """Finish the experiment trackers' runs (rank 0; once) with ``status``: finished, failed or preempted."""
        self.outputs.finish_tracking(status)

    def close(self, status: str = "failed") -> None:
        """Finish the trackers' runs with ``status`` (unless done), close files, and drop the model, optimizer and
        loaders (tracebacks may keep this object alive)."""
        self.outputs.close(status)
        if self.heartbeat is not None:
            self.heartbeat.stop()
        for name in ("trained", "loaders", "intervals", "checkpoints"):
            self.__dict__.pop(name, None)
