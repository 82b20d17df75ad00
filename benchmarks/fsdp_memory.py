#!/usr/bin/env python
"""Parameters + optimizer state each rank holds under ``fsdp`` against ``ddp`` (about 1/N with fsdp).

Two one-step runs of the char LM recipe through ``mgpu launch`` (CPU, gloo; nccl is not needed for this count),
with a larger model and AdamW:
  ddp:  every rank holds all of it: the tensors of last.pt's ``model`` and ``optimizer``;
  fsdp: each rank holds its shards: with sharded checkpoints (fsdp's default) each rank writes exactly those to
        its own file of the torch.distributed.checkpoint folder (last.dcp/__<rank>_*.distcp), whose size is counted.

    python benchmarks/fsdp_memory.py [--nproc 2] [--d-model 256] [--layers 4]      # ~30 s on 2 cores
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import jobs  # noqa: E402

MIB = 2**20


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a nested state dict (dicts, lists), scalars (an optimizer's step count) left out."""
    import torch

    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size() if obj.dim() else 0
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def shard_bytes(dcp_dir: Path) -> dict[int, int]:
    """Bytes each rank wrote to a torch.distributed.checkpoint folder: its ``__<rank>_<n>.distcp`` files."""
    out: dict[int, int] = {}
    for f in dcp_dir.glob("__*_*.distcp"):
        rank = int(f.name[2:].split("_")[0])
        out[rank] = out.get(rank, 0) + f.stat().st_size
    return dict(sorted(out.items()))


def launch(args, strategy: str, root: Path) -> Path:
    run_dir = root / strategy
    mgpu = Path(sys.executable).parent / "mgpu"
    cmd = [*([str(mgpu)] if mgpu.exists() else [sys.executable, "-m", "mgpucli"]), "launch", "--cpu", "--nproc",
           str(args.nproc), str(REPO / "recipes" / "charlm.yaml"), f"run_dir={run_dir}",
           f"trainer.strategy={strategy}", f"model.d_model={args.d_model}", f"model.n_layer={args.layers}",
           f"model.n_head={args.heads}", "data.batch_size=4", "trainer.max_steps=1", "trainer.val_every=0"]
    if strategy == "fsdp":
        cmd.append("trainer.checkpoint_format=sharded")
    log = root / f"{strategy}.log"
    done = jobs.run(cmd, {**os.environ, "OMP_NUM_THREADS": "1"}, args.timeout, log, cwd=REPO)
    if done.rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        sys.exit(f"fsdp_memory.py: the {strategy} run " + ("timed out" if done.rc is None else
                                                           f"exited {done.rc}:\n{tail}"))
    return run_dir / "checkpoints"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    args = ap.parse_args(argv)
    import torch

    root = Path(tempfile.mkdtemp(prefix="mgpu-fsdp-memory-"))
    try:
        full = torch.load(launch(args, "ddp", root) / "last.pt", weights_only=True)
        ddp = tensor_bytes(full["model"]) + tensor_bytes(full["optimizer"])
        fsdp = shard_bytes(launch(args, "fsdp", root) / "last.dcp")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    params = sum(t.numel() for t in full["model"].values())
    print(f"CharTransformer d_model={args.d_model} layers={args.layers} ({params / 1e6:.1f}M parameters), AdamW, "
          f"{args.nproc} CPU processes (gloo)\n")
    print("| strategy | rank | parameters + optimizer state |\n|---|---|---|")
    print(f"| ddp | every rank | {ddp / MIB:.1f} MiB |")
    for rank, size in fsdp.items():
        print(f"| fsdp | {rank} | {size / MIB:.1f} MiB |")
    print(f"\nfsdp / ddp, the largest rank: {max(fsdp.values()) / ddp:.3f} "
          f"(ideal 1/{args.nproc} = {1 / args.nproc:.3f})")
    return 0


if __name__ == "__main__":
    jobs.run_main(main)
