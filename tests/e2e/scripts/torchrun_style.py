"""A torchrun-style script: it reads LOCAL_RANK/RANK/WORLD_SIZE from the environment and trains with a
DistributedSampler (set_epoch every epoch) and DDP, gloo on the CPU. It prints the arguments it got first, so tests
can check that everything after the script reaches it untouched."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(json.dumps({"rank": rank, "local_rank": local_rank, "world": world, "argv": sys.argv[1:],
                  "run_dir": os.environ.get("MGPU_RUN_DIR")}), flush=True)
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        print(f"epoch {epoch} done", flush=True)
dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while another still uses the group
dist.destroy_process_group()
