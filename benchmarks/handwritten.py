"""(A) The hand-written DDP loop that benchmarks/overhead.py holds mgpu against.

Written the way the PyTorch tutorials teach it: ``init_process_group``, ``DistributedSampler`` + ``set_epoch``,
``DistributedDataParallel`` with its defaults, the optimizer, ``loss.backward()``. It trains the same
workloads as mgpu's shipped recipes (recipes/quickstart.yaml, recipes/charlm.yaml), with the same model
classes, the same seed, data order and hyperparameters, so that its final weights can be compared bit for
bit with mgpu's. It keeps no metrics: that bookkeeping is part of mgpu's cost.

Run it with torchrun (overhead.py does): ``torchrun --standalone --nproc-per-node 2 benchmarks/handwritten.py
--workload mlp``. The lines marked ``# bench`` record what overhead.py reads (one timestamp per step, as the
probe does inside mgpu) and are not part of the tutorial loop.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from benchmarks import procinfo
from benchmarks.procinfo import experiments, pin_to_core, process_start_time, rss_mb, thread_cpu_seconds
from mgpucli.components.datasets import CharText, SyntheticClassification
from mgpucli.components.models import MLP, CharTransformer

# The recipes' values, written out as a user would hard-code them (overhead.py checks them against the YAML).
WORKLOADS = {
    "mlp": {"recipe": "quickstart", "seed": 0, "batch_size": 32, "epochs": 3, "lr": 0.05, "momentum": 0.9,
            "T_max": 384, "clip_grad_norm": None},
    "charlm": {"recipe": "charlm", "seed": 0, "batch_size": 16, "epochs": 2, "lr": 0.002, "weight_decay": 0.01,
               "block_size": 64, "clip_grad_norm": 1.0},
}


def build(workload: str):
    """Datasets, model, optimizer, scheduler and loss for one workload (datasets first, then the model)."""
    w = WORKLOADS[workload]
    if workload == "mlp":
        train_set = SyntheticClassification(num_samples=4096, num_features=32, num_classes=4, seed=w["seed"],
                                            split="train")
        model = MLP(in_features=32, out_features=4, hidden=[64, 64])

        def loss_fn(out, y):
            return F.cross_entropy(out, y)

        def make_optim(params):
            opt = torch.optim.SGD(params, lr=w["lr"], momentum=w["momentum"])
            return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=w["T_max"])
    else:
        train_set = CharText(split="train", block_size=w["block_size"])
        model = CharTransformer(vocab_size=96, block_size=w["block_size"], d_model=128, n_head=4, n_layer=2)

        def loss_fn(out, y):
            return F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))

        def make_optim(params):
            return torch.optim.AdamW(params, lr=w["lr"], weight_decay=w["weight_decay"]), None
    return train_set, model, loss_fn, make_optim


# A diagnostic (benchmarks/cores.py --sides A,A+mgpu-imports): the modules an mgpu worker imports beyond this
# loop's (~250 of its ~320 more; mgpu's own code is imported, not run), to tell whether a larger process alone
# makes the steps slower.
MGPU_MODULES = ("mgpucli.cli.app", "mgpucli.cli.train_run", "mgpucli.engine.run", "mgpucli.engine.trainer",
                "mgpucli.engine.data", "mgpucli.engine.checkpoint", "mgpucli.engine.tbevents", "mgpucli.config.loader",
                "mgpucli.config.targets", "mgpucli.distributed.heartbeat", "hydra.utils", "omegaconf", "typer",
                "pydantic", "torchdata.stateful_dataloader", "yaml")


def spin_seconds() -> float:
    """A diagnostic (``MGPU_BENCH_EXPERIMENT=spin-25``): this many microseconds of busy CPU added to every step of
    the loop, to see what a known per-step CPU cost does to whole jobs' step times on this machine."""
    spins = [e for e in experiments() if e.startswith("spin-")]
    if not spins:
        return 0.0
    seconds = procinfo.spin_seconds(spins[0])
    if seconds is None:
        raise ValueError(f"MGPU_BENCH_EXPERIMENT: {spins[0]!r} is not spin-US (microseconds, e.g. spin-25)")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    p.add_argument("--epochs", type=int, default=None)
    args = p.parse_args()
    if "mgpu-imports" in experiments():  # bench: a diagnostic, never in overhead.py's rounds
        import importlib

        for name in MGPU_MODULES:
            importlib.import_module(name)
    marks = {"imports done": time.time()}  # bench
    pinned = pin_to_core()  # bench: only with MGPU_BENCH_PIN=1 (the probe does the same on mgpu's side)
    rss = {"imports done": rss_mb()}  # bench
    w = WORKLOADS[args.workload]
    epochs = args.epochs or w["epochs"]
    out_dir = os.environ.get("MGPU_BENCH_OUT")  # bench

    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available() and os.environ.get("MGPU_BENCH_DEVICE", "cpu") == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    marks["process group"] = time.time()  # bench
    rss["process group"] = rss_mb()  # bench

    torch.manual_seed(w["seed"])
    train_set, model, loss_fn, make_optim = build(args.workload)
    sampler = DistributedSampler(train_set, seed=w["seed"])
    loader = DataLoader(train_set, batch_size=w["batch_size"], sampler=sampler, pin_memory=cuda)
    model = DDP(model.to(device), device_ids=[local_rank] if cuda else None)
    optimizer, scheduler = make_optim(model.parameters())
    marks["model wrapped"] = time.time()  # bench
    rss["model wrapped"] = rss_mb()  # bench

    records, step, first_step_at = [], 0, None  # bench
    spin = spin_seconds()  # bench: 0 unless a diagnostic asks for it
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if w["clip_grad_norm"] is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), w["clip_grad_norm"])
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            step += 1
            if spin:  # bench: a diagnostic's known per-step CPU cost
                until = time.perf_counter() + spin
                while time.perf_counter() < until:
                    pass
            if cuda:  # bench: per-step timestamps on a GPU need the GPU's work done (both sides do this)
                torch.cuda.synchronize()
            records.append((step, epoch, time.perf_counter(), time.process_time(), time.thread_time()))  # bench
            if first_step_at is None:  # bench
                first_step_at = time.time()  # bench
                rss["first step"] = rss_mb()  # bench

    rss["end"] = rss_mb()  # bench
    if out_dir:  # bench: what overhead.py reads
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(out_dir, "weights.pt"))
        info = {"rank": rank, "steps": records, "first_step_at": first_step_at,
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
                "threads": torch.get_num_threads(), "world_size": dist.get_world_size(),
                "thread_cpu_s": thread_cpu_seconds(),
                "started_at": process_start_time(), "marks": marks, "rss_mb": rss, "pinned_core": pinned,
                "gc": __import__("gc").get_stats()}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(info, fh)
        dist.barrier()  # bench: gloo could abort at exit when one rank tore down while the other still wrote
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
