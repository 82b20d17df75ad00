"""Trains forever with DataLoader worker processes (2 per rank), so a test can kill the launcher mid-run and look
for leftovers. Rank 0 prints "loader running" once its workers have delivered a batch."""

import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Slow(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.full((4,), float(index))


dist.init_process_group("gloo")
data = Slow()
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data), num_workers=2, persistent_workers=True)
for epoch in range(1000):
    loader.sampler.set_epoch(epoch)
    for number, batch in enumerate(loader):
        total = batch.sum()
        dist.all_reduce(total)
        if number == 0 and epoch == 0 and dist.get_rank() == 0:
            print("loader running", flush=True)
