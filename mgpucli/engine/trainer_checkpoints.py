"""The Trainer's run directory and checkpoints: deciding the run dir, saving, resuming, the best checkpoint.

:class:`Checkpoints` is a part of :class:`mgpucli.engine.trainer.Trainer` (a mixin): it uses the trainer's
``cfg``, ``tcfg``, ``rt``, ``run_dir``, ``resume``, ``overwrite``, ``wrapped``, ``optimizer``, ``scheduler``,
``scaler``, ``loaders``, ``progress``, ``reporter`` and counters, and sets ``resume_path``, ``writer`` and
(when resuming) ``_pending``. Only rank 0 writes files; every rank joins the collectives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from mgpucli.distributed import runtime as dist_rt
from mgpucli.engine import state as st
from mgpucli.engine.checkpoint import copy_atomic, save_atomic
from mgpucli.engine.rundir import MetricsWriter, checkpoint_dir, prepare_run_dir
from mgpucli.engine.sharded import load_sharded, save_sharded


class Checkpoints:
    """The Trainer's run-dir and checkpoint methods."""

    def _prepare_run_dir(self) -> None:
        """Rank 0 takes (and creates) the run dir; every rank gets the same verdict and checkpoint to resume, so
        all fail or resume together."""
        from mgpucli.errors import UsageError

        verdict: tuple = (None, None)  # (problem, checkpoint to resume)
        if self.rt.is_main:
            try:
                found = prepare_run_dir(self.run_dir, self.resume, self.overwrite,
                                        OmegaConf.to_yaml(self.cfg, resolve=True),
                                        sharded=self.tcfg.checkpoint_format == "sharded")
                self.writer = MetricsWriter(self.run_dir, tensorboard=self.tcfg.tensorboard)
                verdict = (None, str(found) if found is not None else None)
            except UsageError as err:
                verdict = ((err.message, err.hint), None)
        with self.progress.in_phase("setup: run-dir check (broadcast from rank 0)"):
            problem, found = dist_rt.broadcast_object(verdict, self.rt)
        if problem:
            raise UsageError(*problem)
        self.resume_path = Path(found) if found is not None else None

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
        sums = ckpt.get("epoch_sums")
        if ckpt.get("mid_epoch") and isinstance(sums, list) and len(sums) == len(self.epoch_sums):
            self.epoch_sums = [float(v) for v in sums]  # the epoch's means go on from where they were
        changed = st.recipe_changes(ckpt.get("recipe", ""), OmegaConf.to_yaml(self.cfg, resolve=True))
        if changed:
            self.reporter.warn(f"the recipe changed since {path} was saved: {', '.join(changed)}")
        same_world = ckpt.get("world_size") == self.rt.world_size
        per_rank = ckpt.get("per_rank") or []
        mine = per_rank[self.rt.rank] if same_world and self.rt.rank < len(per_rank) else None
        if ckpt.get("mid_epoch") and not same_world:
            self.reporter.warn(f"{path} was saved mid-epoch by {ckpt.get('world_size')} process(es); with "
                               f"{self.rt.world_size} the loader position cannot carry over, so epoch "
                               f"{self.epoch + 1} restarts from its beginning.")
        self._pending = {"loader": mine["loader"] if mine and ckpt.get("mid_epoch") else None,
                         "rng": mine["rng"] if mine else None}
        self.reporter.message(f"resumed from {path} at step {self.step} "
                              f"({st.epoch_label(self.epoch, bool(ckpt.get('mid_epoch')))})")

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
            epoch_sums=list(self.epoch_sums) if mid_epoch else None,
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
