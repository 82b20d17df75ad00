"""The DDP tutorial's pattern: the script spawns its own processes, each sets MASTER_ADDR/MASTER_PORT and joins."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def demo(rank, world_size, port):
    setup(rank, world_size, port)
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    if rank == 0:
        print(f"SPAWN-OK {int(total.item())}", flush=True)


if __name__ == "__main__":
    mp.spawn(demo, args=(2, sys.argv[1]), nprocs=2, join=True)
