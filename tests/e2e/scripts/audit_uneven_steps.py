"""Ranks that take different numbers of optimizer steps, for ``mgpu launch --audit``: rank 1 skips the optimizer
step on every third batch (after backward, so DDP's all-reduce has happened and nothing hangs by itself). An audit
that compared parameters with a collective every few steps would wait for rank 1 at a step it never reaches."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # TRAP optimizer_steps_differ
steps = 0
for epoch in range(5):
    sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if rank == 1 and i % 3 == 2:
            continue  # a rank-local decision to skip a step: the bug
        optimizer.step()
        steps += 1
print(f"rank {rank} took {steps} optimizer steps", flush=True)
dist.barrier()
dist.destroy_process_group()
