"""The benchmark's probe inside mgpu's workers (B); inert unless MGPU_BENCH_OUT is set.

benchmarks/overhead.py puts this directory first on PYTHONPATH for the ``mgpu launch`` runs only. Python
imports ``sitecustomize`` at start-up in every process (launcher and workers); this one registers an import
hook and nothing else, so the launcher pays nothing and a worker pays only when it imports
``mgpucli.engine.trainer``. Then it wraps two methods of the real Trainer:

* ``_optimizer_step``: after it returns, one ``(step, epoch, perf_counter, process_time)`` record, the
  same record the hand-written loop takes at the same point (after ``optimizer.step()`` and the scheduler);
* ``fit``: when training ends, rank 0 saves the final weights and every rank writes its ``rank<N>.json``.

mgpu's code runs unchanged. With MGPU_BENCH_AUDIT=1 (an untimed run) it also counts, per optimizer step,
host synchronisations made from mgpu's own code (``.item()``, ``.tolist()``, ``.cpu()``...), Python-level
collectives, and the number of live Python objects, so overhead.py can check the hot-path rules.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_MARKS: dict[str, float] = {}  # worker start-up milestones (Unix time), reported in rank<N>.json
_RSS: dict[str, float] = {}  # resident memory (MiB) at those milestones, at the first step and at the end


def _patch(module) -> None:
    import json
    import resource
    import time

    import torch

    from benchmarks.procinfo import pin_to_core, process_start_time, rss_mb, thread_cpu_seconds

    _MARKS["imports done"] = time.time()  # the trainer is imported with torch, before the recipe is loaded
    _RSS["imports done"] = rss_mb()
    pinned = pin_to_core()  # only with MGPU_BENCH_PIN=1; the hand-written loop pins at the same point

    trainer_cls = module.Trainer
    out_dir = os.environ["MGPU_BENCH_OUT"]
    audit = _Audit() if os.environ.get("MGPU_BENCH_AUDIT") == "1" else None
    orig_step, orig_fit, orig_epoch = trainer_cls._optimizer_step, trainer_cls.fit, trainer_cls.train_epoch
    orig_setup = trainer_cls.setup
    records: list[tuple[int, int, float, float, float]] = []
    first: list[float] = []

    def _optimizer_step(self):
        result = orig_step(self)
        if self.rt.device.type == "cuda":  # per-step timestamps on a GPU need its work done (both sides)
            torch.cuda.synchronize()
        records.append((self.step, self.epoch, time.perf_counter(), time.process_time(), time.thread_time()))
        if not first:
            first.append(time.time())
            _RSS["first step"] = rss_mb()
        if audit is not None:
            tb = getattr(self.writer, "_tb", None)
            if tb is not None and self.step % self.tcfg.log_every == 0:
                # rank 0's TensorBoard queue (<= 10 events, tests/unit/test_tbevents_queue.py) saws up and down:
                # counted empty, growth is anything else
                tb.flush()
            audit.end_step(self.step, self.tcfg.log_every, self)
        return result

    def fit(self):
        if audit is not None:
            audit.install(self.rt.device)
        result = orig_fit(self)
        _RSS["end"] = rss_mb()
        rank = self.rt.rank
        if rank == 0:
            torch.save(self.wrapped.raw.state_dict(), os.path.join(out_dir, "weights.pt"))
        cuda = self.rt.device.type == "cuda"
        info = {"rank": rank, "steps": records, "first_step_at": first[0] if first else None,
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "cuda_peak_bytes": torch.cuda.max_memory_allocated(self.rt.device) if cuda else None,
                "threads": torch.get_num_threads(), "world_size": self.rt.world_size,
                "audit": audit.report() if audit is not None else None,
                "ddp": _ddp_facts(self.wrapped.train), "thread_cpu_s": thread_cpu_seconds(),
                "started_at": process_start_time(), "marks": _MARKS, "rss_mb": _RSS,
                "pinned_core": pinned, "gc": __import__("gc").get_stats()}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(info, fh)
        return result

    def setup(self, *a, **k):
        _MARKS["process group"] = time.time()  # runtime.setup (the process group) runs just before
        _RSS["process group"] = rss_mb()
        result = orig_setup(self, *a, **k)
        _MARKS["model wrapped"] = time.time()
        _RSS["model wrapped"] = rss_mb()
        return result

    def train_epoch(self, *a, **k):
        if audit is not None:
            audit.epoch_start()  # what ran between epochs (validation, checkpoint) is no step's
        return orig_epoch(self, *a, **k)

    trainer_cls._optimizer_step, trainer_cls.fit, trainer_cls.setup = _optimizer_step, fit, setup
    _experiments(module)
    if audit is not None:
        trainer_cls.train_epoch = train_epoch


def _experiments(trainer_module) -> None:
    """MGPU_BENCH_EXPERIMENT=a,b: swap one piece of mgpu for the hand-written loop's, to find what costs what.
    Diagnostics only (benchmarks/README.md); never used for the published figures."""
    from benchmarks.procinfo import experiments

    wanted = experiments()
    if "plain-loader" in wanted:  # torch's DataLoader instead of torchdata's StatefulDataLoader
        import torch.utils.data

        from mgpucli.engine import data

        data.StatefulDataLoader = torch.utils.data.DataLoader
    if "no-heartbeat" in wanted:  # no per-rank progress thread
        trainer_module.Progress.start = lambda self: None
    if "no-freeze" in wanted:  # start-up's objects not frozen (gc.freeze); full collections resume as usual
        from mgpucli.engine import run
        from mgpucli.heap import resume_full_gc

        run.settle_gc = resume_full_gc


def _ddp_facts(model) -> dict | None:
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return None
    return {"gradient_as_bucket_view": model.gradient_as_bucket_view,
            "bucket_bytes_cap": model.bucket_bytes_cap, "find_unused_parameters": model.find_unused_parameters,
            "static_graph": model.static_graph}


class _Audit:
    """Counts, per optimizer step, what the hot-path rules forbid outside the log interval."""

    SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
    COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list",
                   "barrier", "reduce", "gather", "scatter", "all_gather_into_tensor", "reduce_scatter_tensor")

    def __init__(self) -> None:
        self.syncs = 0
        self.collectives = 0
        self.per_step: list[tuple[int, int, int, int]] = []  # (step, syncs, collectives, live objects)
        self.between_epochs = [0, 0]  # syncs, collectives outside train_epoch (validation, checkpoints)
        self.cuda_sync_warnings = 0

    def install(self, device) -> None:
        import warnings

        import torch
        import torch.distributed as dist

        audit = self

        def from_mgpu() -> bool:
            frame = sys._getframe(2)
            return f"{os.sep}mgpucli{os.sep}" in frame.f_code.co_filename

        for name in self.SYNC_METHODS:
            original = getattr(torch.Tensor, name)

            def counted(self, *a, _orig=original, **k):
                if from_mgpu():
                    audit.syncs += 1
                return _orig(self, *a, **k)

            setattr(torch.Tensor, name, counted)
        for name in self.COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:
                continue

            def counted_c(*a, _orig=original, **k):
                audit.collectives += 1
                return _orig(*a, **k)

            setattr(dist, name, counted_c)
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
            original_showwarning = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                if "synchroniz" in str(message):
                    audit.cuda_sync_warnings += 1
                    return None
                return original_showwarning(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            warnings.simplefilter("always")

    def epoch_start(self) -> None:
        self.between_epochs[0] += self.syncs
        self.between_epochs[1] += self.collectives
        self.syncs = self.collectives = 0

    def end_step(self, step: int, log_every: int, trainer) -> None:
        """Counts since the previous step; live objects (after a full collection) at log-interval steps only,
        so that every sample is taken at the same point of the loop, less those the closed log intervals hold
        until their reduction is read (engine/interval.py: how many wait depends on the pace, up to 16)."""
        import gc

        objects = -1
        if step % log_every == 0:
            gc.collect()
            objects = len(gc.get_objects()) - _held_by_closed_intervals(trainer)
        self.per_step.append((step, self.syncs, self.collectives, objects))
        self.syncs = self.collectives = 0

    def report(self) -> dict:
        return {"per_step": self.per_step, "cuda_sync_warnings": self.cuda_sync_warnings,
                "between_epochs": self.between_epochs}


def _held_by_closed_intervals(trainer) -> int:
    """The GC-tracked objects that closed log intervals hold: each interval, its losses (the list and the
    tensors), its steps and its vector; a reduction in flight, its vector and its list of intervals."""
    import gc

    flight = trainer._in_flight
    intervals = [*trainer._closed, *(flight.intervals if flight is not None else ())]
    held = {id(o): o for c in intervals for o in (c, c.losses, c.loss_steps, c.vec, *c.losses)}
    if flight is not None:
        held.update({id(o): o for o in (flight, flight.flat, flight.intervals)})
    return sum(1 for o in held.values() if gc.is_tracked(o))


class _Hook:
    """A meta-path finder (duck-typed: importing importlib.abc would cost every process)."""

    def find_spec(self, name, path, target=None):
        if name != "mgpucli.engine.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this one shadows, if the environment has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("MGPU_BENCH_OUT"):
    sys.meta_path.insert(0, _Hook())
_chain_next_sitecustomize()
