"""A script whose data sharding is a third-party wrapper's: torchdata's ``StatefulDataLoader`` with its
``StatefulDistributedSampler`` (mid-epoch resumable loading), as users of that library write it. It checkpoints the
model, the optimizer and the loader's position every few steps on rank 0 and resumes from ``--resume``, mid-epoch.
One trap is left in, as users leave it: validation on every rank through a sampler that pads 101 samples to 102.

    torchrun --nproc-per-node 2 torchdata_sharded.py --epochs 2 [--resume ckpt.pt] [--stop-after STEPS]
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--resume", default="")
parser.add_argument("--stop-after", type=int, default=0, help="stop after this many steps (0: never)")
parser.add_argument("--ckpt", default="ckpt.pt")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
train_set = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
val_set = TensorDataset(torch.randn(101, 8), torch.randn(101, 1))
sampler = StatefulDistributedSampler(train_set, seed=3)
loader = StatefulDataLoader(train_set, batch_size=8, sampler=sampler)
val_loader = StatefulDataLoader(val_set, batch_size=16,
                                sampler=StatefulDistributedSampler(val_set, shuffle=False))  # TRAP padded_evaluation
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
start_epoch, step = 0, 0
if args.resume:
    state = torch.load(args.resume, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])
    start_epoch, step = state["epoch"], state["step"]
    print(f"resumed at epoch {start_epoch} step {step}", flush=True)

for epoch in range(start_epoch, args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        step += 1
        if step % 4 == 0 and rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": loader.state_dict(), "epoch": epoch, "step": step}, args.ckpt)
        if step == args.stop_after:
            break
    if step == args.stop_after:
        break
    with torch.no_grad():
        sums = torch.zeros(2)
        for x, y in val_loader:
            sums += torch.stack([torch.nn.functional.mse_loss(model(x), y, reduction="sum"), torch.tensor(len(y))])
        dist.all_reduce(sums)
    if rank == 0:
        print(f"epoch {epoch} step {step} val {float(sums[0] / sums[1]):.4f} over {int(sums[1])}", flush=True)
dist.barrier()
dist.destroy_process_group()
