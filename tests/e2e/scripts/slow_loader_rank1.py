"""A correct DDP script whose rank 1 reads each sample 20 ms slower (for ``mgpu launch --audit``): the audit's pace
check must name rank 1 and its data loading. ``--even`` makes both ranks equally fast: nobody is named."""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SLOW = "--even" not in sys.argv


class Samples(Dataset):
    def __init__(self, rank):
        self.rank = rank
        self.x, self.y = torch.randn(480, 8), torch.randn(480, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if SLOW and self.rank == 1:
            time.sleep(0.02)
        return self.x[i], self.y[i]


dist.init_process_group("gloo")
torch.manual_seed(0)
dataset = Samples(dist.get_rank())
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=4, sampler=sampler)  # 60 steps per rank
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
sampler.set_epoch(0)
for x, y in loader:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
