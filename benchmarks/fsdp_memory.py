"""Per-rank parameter + optimizer-state memory under fsdp versus ddp (about 1/N with fsdp).

Run:  python benchmarks/fsdp_memory.py [--nproc 2] [--d-model 256] [--layers 4]
It starts torch.distributed.run with gloo on CPU (nccl on GPUs is not needed for this count), builds mgpu's
CharTransformer the way mgpu's strategies do, takes one AdamW step, and counts the bytes each rank holds in
its local parameter shards and optimizer state (DTensor shards counted by their local part).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def _local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def worker(strategy: str, d_model: int, layers: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from mgpucli.components.models import CharTransformer
    from mgpucli.config.schema import TrainerSchema
    from mgpucli.distributed.env import read_rank_env
    from mgpucli.distributed.runtime import setup, teardown
    from mgpucli.engine.strategy import wrap_model

    env = read_rank_env()
    rt = setup(env, "cpu", 300, 1)
    torch.manual_seed(0)
    model = CharTransformer(block_size=64, d_model=d_model, n_head=4, n_layer=layers)
    tcfg = OmegaConf.structured(TrainerSchema)
    tcfg.strategy = strategy
    wrapped = wrap_model(model, tcfg, rt)
    opt = torch.optim.AdamW(wrapped.raw.parameters(), lr=1e-3)
    x = torch.randint(0, 96, (4, 64))
    wrapped.train(x).float().mean().backward()
    opt.step()
    params = _local_bytes(wrapped.raw.parameters())
    states = _local_bytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    gathered = [None] * rt.world_size
    dist.all_gather_object(gathered, {"rank": rt.rank, "params": params, "optimizer": states})
    if rt.is_main:
        with open(out, "w") as fh:
            json.dump(gathered, fh)
    # gloo can abort at exit (SIGABRT) when one rank tears the group down while the other still writes: meet first,
    # as mgpu train and benchmarks/handwritten.py do
    dist.barrier()
    teardown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.children import exit_on_sigterm, run_tree

    exit_on_sigterm()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("ddp", "fsdp"):
            out = os.path.join(tmp, f"{strategy}.json")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
                   __file__, "--worker", strategy, str(args.d_model), str(args.layers), out]
            rc, stdout, stderr = run_tree(cmd, {**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
            if rc != 0:
                sys.exit(f"fsdp_memory.py: the {strategy} run " + ("took over 600 s" if rc is None else
                                                                   f"exited {rc}:\n{(stdout + stderr)[-3000:]}"))
            with open(out) as fh:
                rows[strategy] = json.load(fh)
    mib = 1024 * 1024
    print(f"CharTransformer d_model={args.d_model} layers={args.layers}, AdamW, {args.nproc} processes (gloo, CPU)")
    print(f"{'strategy':8} {'rank':>4} {'params MiB':>11} {'optim MiB':>10} {'total MiB':>10}")
    for strategy, ranks in rows.items():
        for r in ranks:
            p, o = r["params"] / mib, r["optimizer"] / mib
            print(f"{strategy:8} {r['rank']:>4} {p:>11.2f} {o:>10.2f} {p + o:>10.2f}")
    ddp = max(r["params"] + r["optimizer"] for r in rows["ddp"])
    fsdp = max(r["params"] + r["optimizer"] for r in rows["fsdp"])
    print(f"fsdp / ddp per-rank (largest rank): {fsdp / ddp:.3f}  (ideal 1/{args.nproc} = {1 / args.nproc:.3f})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main()
