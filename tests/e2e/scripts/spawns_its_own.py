"""The ImageNet example's pattern: with --multiprocessing-distributed the script is its own launcher, one process
per device through torch.multiprocessing.spawn, each joining a group of its own making."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset


def main_worker(index, nprocs):
    dist.init_process_group("gloo", rank=index, world_size=nprocs)
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    args = parser.parse_args()
    # DataLoader workers are processes of the rank too: they are no launcher
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=2)
    print("batches:", sum(1 for _ in loader), flush=True)
    if args.multiprocessing_distributed:
        mp.spawn(main_worker, args=(2,), nprocs=2)
    else:  # the ranks mgpu launch started
        main_worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    print("done", flush=True)
