"""The tutorial's traps in one script, for ``mgpu launch --audit``: a model never wrapped in DDP, a plain DataLoader,
a DistributedSampler whose set_epoch is never called, a padded validation sampler (101 samples on 2 ranks) and every
rank saving to one path. It runs to its end without an error and exits with its own code (``--exit-code``)."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
train_set = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
extra_set = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
val_set = TensorDataset(torch.randn(101, 4), torch.randn(101, 1))

torch.manual_seed(dist.get_rank())  # a seed per rank, as for dropout: DDP would broadcast rank 0's weights
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # TRAP params_diverged
train_loader = DataLoader(train_set, batch_size=16, shuffle=True)  # TRAP loader_not_distributed
extra_sampler = DistributedSampler(extra_set)  # TRAP set_epoch_missing
extra_loader = DataLoader(extra_set, batch_size=8, sampler=extra_sampler)
val_sampler = DistributedSampler(val_set, shuffle=False)  # TRAP padded_evaluation
val_loader = DataLoader(val_set, batch_size=10, sampler=val_sampler)

for epoch in range(3):
    for loader in (train_loader, extra_loader):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    with torch.no_grad():
        total = sum(torch.nn.functional.mse_loss(model(x), y, reduction="sum") for x, y in val_loader)
    print(f"epoch {epoch} val {float(total):.4f}", flush=True)
    torch.save(model.state_dict(), os.path.join(os.environ["MGPU_RUN_DIR"], "model.pt"))  # TRAP same_save_path
dist.barrier()
dist.destroy_process_group()
sys.exit(args.exit_code)
