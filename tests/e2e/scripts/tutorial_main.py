"""The DataParallel-vs-DDP tutorial's script, as users have it: it declares ``--local_rank`` (underscore) for
``python -m torch.distributed.launch`` and never reads LOCAL_RANK. gloo on the CPU, so tests run anywhere.

Writes ``final_weights.pt`` from rank 0 into ``--out`` (or $MGPU_RUN_DIR) so tests can compare runs.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--out", default=None)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=16, sampler=sampler)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"local_rank {args.local_rank} epoch {epoch} loss {loss.item():.4f}", flush=True)
if rank == 0:
    out = args.out or os.environ.get("MGPU_RUN_DIR", ".")
    torch.save(model.module.state_dict(), os.path.join(out, "final_weights.pt"))
dist.barrier()  # torch 2.13's gloo can abort a rank that tears down while another still uses the group
dist.destroy_process_group()
