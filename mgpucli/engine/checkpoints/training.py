"""A run's checkpoints: taking the run dir, saving everything a run needs to continue bitwise, restoring it.

Only rank 0 writes files; every rank joins the collectives (state dicts are collective under FSDP, and every rank
hands in its loader position and RNG state). The file layout and the atomic writes are :mod:`.files`'s;
the sharded (FSDP, ``torch.distributed.checkpoint``) variant is :mod:`.sharded`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mgpucli import batch_layout
from mgpucli.batch_layout import Layout, Resolution, Segment
from mgpucli.distributed import collectives
from mgpucli.distributed.heartbeat import Heartbeat
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.checkpoints import state as engine_state
from mgpucli.engine.checkpoints.files import copy_atomic, save_atomic
from mgpucli.engine.checkpoints.sharded import AsyncSave, load_sharded, save_sharded
from mgpucli.engine.early_stopping import EarlyStopping
from mgpucli.engine.ema import EMA
from mgpucli.engine.reporter import Reporter
from mgpucli.engine.rundir import prepare_run_dir
from mgpucli.engine.strategy import Wrapped
from mgpucli.errors import UsageError
from mgpucli.metric_mode import resolve_mode
from mgpucli.run_files import check_start, checkpoint_dir, requested_sharded, writes_sharded
from mgpucli.run_layout import BEST_FULL, LAST_FULL, step_glob, step_name


@dataclass
class Trained:
    """What a checkpoint holds the state of (built by the trainer, read and restored here)."""

    model: Wrapped
    optimizer: torch.optim.Optimizer
    scheduler: Any  # an LR scheduler, or None
    scaler: torch.amp.GradScaler | None
    train_loader: Any  # a StatefulDataLoader: its position is saved mid-epoch
    ema: EMA | None = None  # the weights' moving average (trainer.ema)
    early_stopping: EarlyStopping | None = None  # its count of validations without improvement


@dataclass
class Position:
    """Where the run is: its counters and the last validation."""

    step: int = 0
    epoch: int = 0  # epochs completed (the epoch in progress is epoch + 1 in everything a user reads)
    last_val: dict[str, Any] | None = None


@dataclass
class Resumed:
    """What a rank applies once its loader exists: its loader position and the epoch's metric sums so far
    (mid-epoch), and its RNG state; and the experiment trackers' run ids the checkpoint was saved with."""

    loader: Any = None
    rng: dict[str, Any] | None = None
    epoch_sums: list[float] | None = None
    trackers: dict[str, str] | None = None
    epoch_start: int | None = None  # mid-epoch: samples of the epoch's order the sampler skips
    batches_taken: int = 0  # mid-epoch, with ``loader``: the batches each rank had taken since epoch_start


class Checkpoints:
    """The run dir and its checkpoints for one rank of the job."""

    def __init__(self, cfg: DictConfig, runtime: Runtime, heartbeat: Heartbeat, reporter: Reporter):
        self.runtime, self.heartbeat, self.reporter = runtime, heartbeat, reporter
        self.run_dir = Path(cfg.run_dir)
        self.recipe_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        self.layout: Layout | None = None  # this segment's (set by use())
        self.nodes: int | None = None  # on how many nodes (set by use(); None: not recorded)
        self.segments: list[Segment] = []  # the run's, this one last
        self._accum_said = False  # resolve_layout's note already says trainer.grad_accum changed
        trainer = cfg.trainer
        self.format, self.strategy = str(trainer.checkpoint_format), str(trainer.strategy)
        self.sharded_format = writes_sharded(self.format, self.strategy, None)  # decided again by check_run_dir
        self.keep = int(trainer.keep_checkpoints)
        self.best_metric, self.best_mode = trainer.best_metric, trainer.best_mode
        never = "the recipe has no data.val" if cfg.data.get("val") is None else \
            "trainer.val_every=0" if trainer.val_every == 0 else None
        if self.best_metric and never:
            reporter.warn(f"trainer.best_metric={self.best_metric} picks {BEST_FULL} by validation, but {never}: this "
                          f"run writes no {BEST_FULL} (set trainer.best_metric=null to say so).")
        self.best: float | None = None
        self.tracker_ids: Callable[[], dict[str, str]] | None = None  # rank 0's experiment trackers' run ids
        self.async_save = bool(trainer.async_save)  # sharded checkpoints written in the background
        self.stop_requested: Callable[[], bool] = lambda: False  # set by the trainer: a stop signal arrived
        self._in_flight: AsyncSave | None = None
        self._written: Callable[[], None] = lambda: None
        self._started = 0.0

    def use(self, cfg: DictConfig, layout: Layout, nodes: int | None = None) -> None:
        """The recipe as built (its run length resolved) and the layout this run trains on (on ``nodes``, recorded
        for a job of several nodes or an elastic one): what checkpoints record."""
        self.recipe_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        self.layout, self.nodes, self.segments = layout, nodes, [Segment(1, layout, nodes)]

    def resolve_layout(self, found: Path, batch_size: int, grad_accum: int, pinned: frozenset[str]) -> Resolution:
        """The layout a resume from ``found`` trains on (:func:`mgpucli.batch_layout.keep_global_batch`), decided by
        rank 0 from the checkpoint's last segment (read without loading it) and the same on every rank; a resume
        no layout fits is a UsageError on every rank."""
        world = self.runtime.world_size

        def decide() -> Resolution:
            from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info

            info = read_checkpoint_info(str(found))
            segments = info.segments if info is not None else []
            if not segments:  # written before checkpoints recorded their layout: the recipe's, as it is
                return Resolution(Layout(world, batch_size, grad_accum))
            return batch_layout.keep_global_batch(segments[-1].layout, world, batch_size, grad_accum, pinned)

        resolution = self._agree("the resumed run's global batch", decide)
        self._accum_said = resolution.note is not None
        return resolution

    def check_run_dir(self, resume: str | None, overwrite: bool) -> Path | None:
        """Whether the run may start in the run dir as asked (:func:`mgpucli.run_files.check_start`): rank 0 decides,
        every rank gets the same verdict and the same checkpoint to resume from (None: a fresh start), so all fail or
        resume together. Nothing is written yet: a checkpoint that turns out not to fit leaves the run dir as it was.
        """
        def decide() -> tuple[str | None, bool]:  # and the format this run writes (auto: rank 0's look at it)
            found = check_start(self.run_dir, resume, overwrite, requested_sharded(self.format))
            return (str(found) if found is not None else None), writes_sharded(self.format, self.strategy, found)

        found, self.sharded_format = self._agree("run-dir check", decide)
        if self.async_save and not self.sharded_format:  # auto, resuming a full checkpoint
            raise UsageError(f"trainer.async_save writes sharded checkpoints, but this run continues {found}, a full "
                             "checkpoint, and keeps its format.",
                             "Drop trainer.async_save, or set trainer.checkpoint_format=sharded to write sharded ones "
                             "from now on.")
        return Path(found) if found is not None else None

    def take_run_dir(self, overwrite: bool) -> None:
        """Rank 0 takes the run dir (creates it, writes the recipe; ``overwrite`` deletes the old checkpoints), once
        :meth:`check_run_dir` allowed the start and any checkpoint to resume was loaded."""
        self._agree("taking the run dir", lambda: prepare_run_dir(self.run_dir, overwrite, self.recipe_yaml))

    def _agree(self, what: str, decide) -> Any:
        """``decide()`` on rank 0, its (picklable) result or its UsageError on every rank."""
        verdict: tuple = (None, None)  # (problem, result)
        if self.runtime.is_main:
            try:
                found = decide()
                verdict = (None, str(found) if isinstance(found, Path) else found)
            except UsageError as err:
                verdict = ((err.message, err.hint), None)
        with self.heartbeat.in_phase(f"setup: {what} (broadcast from rank 0)"):
            problem, found = collectives.broadcast_object(verdict, self.runtime)
        if problem:
            raise UsageError(*problem)
        return found

    def save(self, trained: Trained, position: Position, epoch_sums: list[float], data_position: dict[str, int] | None,
             best: bool = False, written: Callable[[], None] | None = None) -> None:
        """Every rank joins; rank 0 writes ``last.pt`` atomically (and ``best.pt``, numbered copies), or every rank its
        shards (``last.dcp``). ``data_position`` (mid-epoch only): ``consumed``, the samples of the epoch's order every
        rank together has taken, and ``skipped``, those this segment's sampler started after. ``written()`` is called
        once this rank's part is done; on rank 0 as ``last.pt`` becomes complete (just before its rename). With
        ``trainer.async_save`` the shards are written in the background: ``written()`` is called by :meth:`wait`,
        which the next save, a stop and the end of the run call."""
        written = written or (lambda: None)
        self.wait()  # a save still in flight ends first
        started = time.monotonic()
        mid_epoch = data_position is not None
        with self.heartbeat.in_phase("checkpoint: gathering state from every rank"):
            tensors = None if self.sharded_format else self._full_tensors(trained)
            mine = {"rng": engine_state.capture_rng(self.runtime.device),
                    "loader": trained.train_loader.state_dict() if mid_epoch else None}
            per_rank = collectives.all_gather_objects(mine, self.runtime)
        meta = self._meta(trained, position, epoch_sums, data_position, per_rank)
        if tensors is not None:
            self._write_full(tensors, meta, position.step, best, written)
        else:
            with self.heartbeat.in_phase("checkpoint: writing shards"):
                pending = save_sharded(trained.model.raw, trained.optimizer, meta, checkpoint_dir(self.run_dir),
                                       position.step, self.runtime, self.keep, best,
                                       extra=self._sharded_extra(trained), in_background=self.async_save,
                                       held_until=self.stop_requested)
            if pending is not None:
                self._in_flight, self._written, self._started = pending, written, started
                self.reporter.message(f"checkpoint at step {position.step}: training goes on after "
                                      f"{time.monotonic() - started:.2f} s; its shards are written in the background")
                return
            written()
        self.reporter.message(f"checkpoint at step {position.step} written in {time.monotonic() - started:.2f} s "
                              f"({'sharded' if tensors is None else 'full'})")

    def wait(self) -> None:
        """The checkpoint being written in the background (``trainer.async_save``), if any, is complete when this
        returns (``last.dcp`` names it); a DiskWriteError when its write failed (the previous checkpoint is kept)."""
        pending, self._in_flight = self._in_flight, None
        if pending is None:
            return
        with self.heartbeat.in_phase("checkpoint: waiting for the save in flight"):
            pending.wait()
        self._written()
        self.reporter.message(f"checkpoint at step {pending.step} complete, {time.monotonic() - self._started:.2f} s "
                              "after it began")

    def _full_tensors(self, trained: Trained) -> dict[str, Any]:
        """The whole model, optimizer state (and EMA) gathered on rank 0 (``{}`` parts elsewhere): collective."""
        model = engine_state.model_state(trained.model.raw)
        tensors = {"model": model, "optimizer": engine_state.optimizer_state(trained.model.raw, trained.optimizer)}
        if trained.ema is not None:
            tensors["ema"] = trained.ema.full_state(model)
        return tensors

    def _write_full(self, tensors: dict[str, Any], meta: dict[str, Any], step: int, best: bool,
                    written: Callable[[], None]) -> None:
        if not self.runtime.is_main:
            written()
            return
        ckpts = checkpoint_dir(self.run_dir)
        save_atomic({**meta, **tensors}, ckpts / LAST_FULL, step=step, committing=written)
        if best:
            copy_atomic(ckpts / LAST_FULL, ckpts / BEST_FULL)
        if self.keep > 0:
            copy_atomic(ckpts / LAST_FULL, ckpts / step_name(step, sharded=False))
            for old in sorted(ckpts.glob(step_glob(sharded=False)))[: -self.keep]:
                old.unlink(missing_ok=True)

    def _meta(self, trained: Trained, position: Position, epoch_sums: list[float],
              data_position: dict[str, int] | None, per_rank: list[dict[str, Any]] | None) -> dict[str, Any]:
        """Everything a checkpoint holds but the tensors of the model, the optimizer and the EMA."""
        mid_epoch = data_position is not None
        return engine_state.build_payload(
            scheduler=trained.scheduler.state_dict() if trained.scheduler is not None else None,
            scaler=trained.scaler.state_dict() if trained.scaler is not None else None,
            epoch=position.epoch, step=position.step, mid_epoch=mid_epoch, per_rank=per_rank,
            world_size=self.runtime.world_size, recipe=self.recipe_yaml, metrics=position.last_val,
            best=self.best, best_metric=self.best_metric,
            epoch_sums=list(epoch_sums) if mid_epoch else None, data_position=data_position,
            segments=[segment.record() for segment in self.segments],
            trackers=self.tracker_ids() if self.tracker_ids is not None else None,
            early_stopping=trained.early_stopping.state_dict() if trained.early_stopping is not None else None,
        )

    def save_alone(self, trained: Trained, position: Position, epoch_sums: list[float],
                   data_position: dict[str, int] | None) -> bool:
        """This rank alone writes ``last.pt`` from the state it holds, with no collective (the other ranks may be
        gone): the last step every rank completed, kept by a survivor of a lost node
        (:mod:`mgpucli.engine.checkpoints.rescue`). Every rank's per-rank state (loader position, RNG) is left out:
        a resume goes on from the epoch's data position, on any process count. Returns whether it wrote it."""
        from mgpucli.engine.checkpoints import rescue

        tensors = {"model": engine_state.model_state(trained.model.raw, alone=True),
                   "optimizer": engine_state.optimizer_state(trained.model.raw, trained.optimizer, alone=True)}
        if trained.ema is not None:
            tensors["ema"] = trained.ema.full_state(tensors["model"])
        meta = self._meta(trained, position, epoch_sums, data_position, per_rank=None)
        return rescue.write_if_newer({**meta, **tensors}, checkpoint_dir(self.run_dir) / LAST_FULL, position.step)

    def load(self, path: Path, trained: Trained, position: Position) -> Resumed:
        """Restore the weights, the optimizer, the schedules and ``position`` from ``path``; returns this rank's
        loader position and RNG state, which the trainer applies once the epoch's loader iterator exists."""
        if path.is_dir():
            ckpt = load_sharded(trained.model.raw, trained.optimizer, path, extra=self._sharded_extra(trained))
            has_ema = "ema" in ckpt.get("extra", ())
        else:
            ckpt = engine_state.read_mgpu_checkpoint(path)
            engine_state.load_model_state(trained.model.raw, ckpt["model"], str(path))
            engine_state.load_optimizer_state(trained.model.raw, trained.optimizer, ckpt["optimizer"])
            has_ema = ckpt.get("ema") is not None
            if trained.ema is not None and has_ema:
                trained.ema.load_full_state(ckpt["ema"])
        if trained.ema is not None and not has_ema:
            trained.ema.restart()
            self.reporter.warn(f"{path} holds no EMA weights (saved without trainer.ema): the average starts from "
                               "its weights.")
        if trained.scheduler is not None and ckpt.get("scheduler") is not None:
            trained.scheduler.load_state_dict(ckpt["scheduler"])
        if trained.scaler is not None and ckpt.get("scaler"):
            trained.scaler.load_state_dict(ckpt["scaler"])
        if trained.early_stopping is not None and ckpt.get("early_stopping"):
            trained.early_stopping.load_state_dict(ckpt["early_stopping"])
        mid_epoch = bool(ckpt.get("mid_epoch"))
        position.step, position.epoch, self.best = ckpt["step"], ckpt["epoch"], ckpt.get("best")
        changed = [key for key in engine_state.recipe_changes(ckpt.get("recipe", ""), self.recipe_yaml)
                   if not (self._accum_said and key == "trainer.grad_accum")]
        if changed:
            self.reporter.warn(f"the recipe changed since {path} was saved: {', '.join(changed)}")
        self.segments = batch_layout.continued(batch_layout.segments_of(ckpt), position.step, self.layout, self.nodes)
        self.reporter.message(f"resumed from {path} at step {position.step} "
                              f"({engine_state.epoch_label(position.epoch, mid_epoch)}): "
                              f"{batch_layout.describe(self.segments, position.step)}")
        resumed = self._data_position(ckpt, mid_epoch, path, position, len(trained.train_loader.dataset))
        sums = ckpt.get("epoch_sums") if mid_epoch else None  # the epoch's means go on from where they were
        ids = ckpt.get("trackers")
        resumed.epoch_sums = [float(v) for v in sums] if isinstance(sums, list) else None
        resumed.trackers = {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else None
        return resumed

    def _data_position(self, ckpt: dict[str, Any], mid_epoch: bool, path: Path, position: Position,
                       train_samples: int) -> Resumed:
        """Where this rank's loader and RNG go on. On the process count and per-process batch the checkpoint was
        saved with, each rank's own loader position and RNG state (bitwise what an uninterrupted run does); on
        another, the epoch's order after the samples every rank together had consumed."""
        world, rank = self.runtime.world_size, self.runtime.rank
        same_world = ckpt.get("world_size") == world
        saved = batch_layout.segments_of(ckpt)
        same_batch = not saved or saved[-1].layout.batch_size == self.layout.batch_size
        per_rank = ckpt.get("per_rank") or []
        mine = per_rank[rank] if same_world and rank < len(per_rank) else None
        resumed = Resumed(rng=mine["rng"] if mine else None)
        if not mid_epoch:
            return resumed
        data = ckpt.get("data_position")
        if mine and same_batch and mine.get("loader") is not None:
            resumed.loader = mine["loader"]
            if data:
                resumed.epoch_start = data["skipped"]
                resumed.batches_taken = (data["consumed"] - data["skipped"]) // (self.layout.batch_size * world)
            return resumed
        if not data:
            self.reporter.warn(f"{path} was saved mid-epoch by {ckpt.get('world_size')} process(es) by an mgpu that "
                               f"did not record the epoch's position: with {world} epoch {position.epoch + 1} "
                               "restarts from its beginning.")
            return resumed
        resumed.epoch_start = data["consumed"]
        self.reporter.message(f"epoch {position.epoch + 1} goes on after the {data['consumed']} of its "
                              f"{train_samples} samples already trained on, in the same order, on {world} "
                              "process(es).")
        return resumed

    @staticmethod
    def _sharded_extra(trained: Trained) -> dict[str, dict[str, torch.Tensor]]:
        """What sharded checkpoints hold beside the model and the optimizer: the EMA's shards."""
        return {"ema": trained.ema.sharded_state()} if trained.ema is not None else {}

    def improves_best(self, val: dict[str, Any] | None) -> bool:
        """Whether ``val`` beats the best so far on ``trainer.best_metric`` (and records it if so)."""
        name = self.best_metric
        if not name or not val or name not in val:
            return False
        mode = resolve_mode(name, self.best_mode)
        value = float(val[name])
        better = self.best is None or (value < self.best if mode == "min" else value > self.best)
        if better:
            self.best = value
        return better
