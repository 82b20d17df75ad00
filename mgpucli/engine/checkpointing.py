"""A run's checkpoints: taking the run dir, saving everything a run needs to continue bitwise, restoring it.

Only rank 0 writes files; every rank joins the collectives (state dicts are collective under FSDP, and every rank
hands in its loader position and RNG state). The file layout and the atomic writes are :mod:`.checkpoint`'s;
the sharded (FSDP, ``torch.distributed.checkpoint``) variant is :mod:`.sharded`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mgpucli.distributed import collectives
from mgpucli.distributed.heartbeat import Heartbeat
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine import state as engine_state
from mgpucli.engine.checkpoint import copy_atomic, save_atomic
from mgpucli.engine.early_stopping import EarlyStopping, resolve_mode
from mgpucli.engine.ema import EMA
from mgpucli.engine.reporter import Reporter
from mgpucli.engine.rundir import prepare_run_dir
from mgpucli.engine.sharded import load_sharded, save_sharded
from mgpucli.engine.strategy import Wrapped
from mgpucli.errors import UsageError
from mgpucli.run_files import check_start, checkpoint_dir
from mgpucli.run_layout import BEST_FULL, LAST_FULL, step_name


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


class Checkpoints:
    """The run dir and its checkpoints for one rank of the job."""

    def __init__(self, cfg: DictConfig, runtime: Runtime, heartbeat: Heartbeat, reporter: Reporter):
        self.runtime, self.heartbeat, self.reporter = runtime, heartbeat, reporter
        self.run_dir = Path(cfg.run_dir)
        self.recipe_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        trainer = cfg.trainer
        self.sharded_format = trainer.checkpoint_format == "sharded"
        self.keep = int(trainer.keep_checkpoints)
        self.best_metric, self.best_mode = trainer.best_metric, trainer.best_mode
        never = "the recipe has no data.val" if cfg.data.get("val") is None else \
            "trainer.val_every=0" if trainer.val_every == 0 else None
        if self.best_metric and never:
            reporter.warn(f"trainer.best_metric={self.best_metric} picks best.pt by validation, but {never}: this run "
                          "writes no best.pt (set trainer.best_metric=null to say so).")
        self.best: float | None = None
        self.tracker_ids: Callable[[], dict[str, str]] | None = None  # rank 0's experiment trackers' run ids

    def check_run_dir(self, resume: str | None, overwrite: bool) -> Path | None:
        """Whether the run may start in the run dir as asked (:func:`mgpucli.run_files.check_start`): rank 0 decides,
        every rank gets the same verdict and the same checkpoint to resume from (None: a fresh start), so all fail or
        resume together. Nothing is written yet: a checkpoint that turns out not to fit leaves the run dir as it was.
        """
        return self._agree("run-dir check", lambda: check_start(self.run_dir, resume, overwrite, self.sharded_format))

    def take_run_dir(self, overwrite: bool) -> None:
        """Rank 0 takes the run dir (creates it, writes the recipe; ``overwrite`` deletes the old checkpoints), once
        :meth:`check_run_dir` allowed the start and any checkpoint to resume was loaded."""
        self._agree("taking the run dir", lambda: prepare_run_dir(self.run_dir, overwrite, self.recipe_yaml))

    def _agree(self, what: str, decide) -> Path | None:
        """``decide()`` on rank 0, its result or its UsageError on every rank."""
        verdict: tuple = (None, None)  # (problem, path)
        if self.runtime.is_main:
            try:
                found = decide()
                verdict = (None, str(found) if found is not None else None)
            except UsageError as err:
                verdict = ((err.message, err.hint), None)
        with self.heartbeat.in_phase(f"setup: {what} (broadcast from rank 0)"):
            problem, found = collectives.broadcast_object(verdict, self.runtime)
        if problem:
            raise UsageError(*problem)
        return Path(found) if found is not None else None

    def save(self, trained: Trained, position: Position, epoch_sums: list[float], mid_epoch: bool,
             best: bool = False) -> None:
        """Every rank joins; rank 0 writes ``last.pt`` atomically (and ``best.pt``, numbered copies)."""
        sharded = self.sharded_format and trained.model.is_fsdp
        with self.heartbeat.in_phase("checkpoint: gathering state from every rank"):
            if not sharded:
                model = engine_state.model_state(trained.model.raw)
                optim = engine_state.optimizer_state(trained.model.raw, trained.optimizer)
                ema = trained.ema.full_state(model) if trained.ema is not None else None
            mine = {"rng": engine_state.capture_rng(self.runtime.device),
                    "loader": trained.train_loader.state_dict() if mid_epoch else None}
            per_rank = collectives.all_gather_objects(mine, self.runtime)
        meta = engine_state.build_payload(
            scheduler=trained.scheduler.state_dict() if trained.scheduler is not None else None,
            scaler=trained.scaler.state_dict() if trained.scaler is not None else None,
            epoch=position.epoch, step=position.step, mid_epoch=mid_epoch, per_rank=per_rank,
            world_size=self.runtime.world_size, recipe=self.recipe_yaml, metrics=position.last_val,
            best=self.best, best_metric=self.best_metric,
            epoch_sums=list(epoch_sums) if mid_epoch else None,
            trackers=self.tracker_ids() if self.tracker_ids is not None else None,
            early_stopping=trained.early_stopping.state_dict() if trained.early_stopping is not None else None,
        )
        ckpts = checkpoint_dir(self.run_dir)
        if sharded:
            with self.heartbeat.in_phase("checkpoint: writing shards"):
                save_sharded(trained.model.raw, trained.optimizer, meta, ckpts, position.step, self.runtime,
                             self.keep, best, extra=self._sharded_extra(trained))
            return
        if not self.runtime.is_main:
            return
        tensors = {"model": model, "optimizer": optim, **({"ema": ema} if ema is not None else {})}
        save_atomic({**meta, **tensors}, ckpts / LAST_FULL, step=position.step)
        if best:
            copy_atomic(ckpts / LAST_FULL, ckpts / BEST_FULL)
        if self.keep > 0:
            copy_atomic(ckpts / LAST_FULL, ckpts / step_name(position.step, sharded=False))
            for old in sorted(ckpts.glob("step-*.pt"))[: -self.keep]:
                old.unlink(missing_ok=True)

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
        changed = engine_state.recipe_changes(ckpt.get("recipe", ""), self.recipe_yaml)
        if changed:
            self.reporter.warn(f"the recipe changed since {path} was saved: {', '.join(changed)}")
        world, rank = self.runtime.world_size, self.runtime.rank
        same_world = ckpt.get("world_size") == world
        per_rank = ckpt.get("per_rank") or []
        mine = per_rank[rank] if same_world and rank < len(per_rank) else None
        if mid_epoch and not same_world:
            self.reporter.warn(f"{path} was saved mid-epoch by {ckpt.get('world_size')} process(es); with {world} "
                               f"the loader position cannot carry over, so epoch {position.epoch + 1} restarts from "
                               "its beginning.")
        self.reporter.message(f"resumed from {path} at step {position.step} "
                              f"({engine_state.epoch_label(position.epoch, mid_epoch)})")
        sums = ckpt.get("epoch_sums") if mid_epoch else None  # the epoch's means go on from where they were
        ids = ckpt.get("trackers")
        return Resumed(loader=mine["loader"] if mine and mid_epoch else None, rng=mine["rng"] if mine else None,
                       epoch_sums=[float(v) for v in sums] if isinstance(sums, list) else None,
                       trackers={str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else None)

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
