"""A correct torchrun-style script, for ``mgpu launch --audit``: DDP, a DistributedSampler with set_epoch every
epoch, exact validation on every rank over a dataset the world size divides, a test pass on rank 0 alone with a
plain DataLoader, and rank 0 alone saving. The audit must find nothing, and change nothing: rank 0 saves the final
weights to ``$MGPU_RUN_DIR/final.pt`` for a bitwise comparison with a run without ``--audit``, and says whether torch
was imported before its first line and whether the audit is loaded."""

import sys

TORCH_BEFORE = "torch" in sys.modules

import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
train_set = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
val_set = TensorDataset(torch.randn(100, 8), torch.randn(100, 1))
test_set = TensorDataset(torch.randn(37, 8), torch.randn(37, 1))
sampler = DistributedSampler(train_set, seed=1)
loader = DataLoader(train_set, batch_size=8, sampler=sampler)
val_loader = DataLoader(val_set, batch_size=10, sampler=DistributedSampler(val_set, shuffle=False))
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1)))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
for epoch in range(4):
    sampler.set_epoch(epoch)
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        sums = torch.zeros(2)
        for x, y in val_loader:
            sums += torch.stack([torch.nn.functional.mse_loss(model(x), y, reduction="sum"), torch.tensor(len(y))])
        dist.all_reduce(sums)
    if rank == 0:
        print(f"epoch {epoch} val {float(sums[0] / sums[1]):.6f} over {int(sums[1])}", flush=True)
if rank == 0:
    with torch.no_grad():  # the test set, once, on rank 0 alone: a plain DataLoader is right here
        test = sum(torch.nn.functional.mse_loss(model(x), y, reduction="sum") for x, y in DataLoader(test_set, 16))
    print(f"test {float(test) / len(test_set):.6f}", flush=True)
    torch.save(model.module.state_dict(), os.path.join(os.environ["MGPU_RUN_DIR"], "final.pt"))
    print(f"torch before the first line: {TORCH_BEFORE}; audit loaded: {'mgpucli.audit' in sys.modules}", flush=True)
dist.barrier()
dist.destroy_process_group()
