"""A Lightning Fabric training loop as users write it: ``Fabric(accelerator="cpu", strategy=...)``, ``fabric.launch()``,
``fabric.setup`` of the model and optimizer, ``fabric.setup_dataloaders`` of a shuffled training loader and an
evaluation loader, ``fabric.backward``, the evaluation loss summed with ``fabric.all_reduce``. Run under
``mgpu launch --cpu --nproc 2`` (Fabric reads torchrun's environment and joins the job).

``--strategy``: ``ddp`` (the default: find_unused_parameters=False), ``find-unused-true``
(``DDPStrategy(find_unused_parameters=True)``), ``find-unused-false`` (``DDPStrategy(find_unused_parameters=False)``).
``--extra-head`` adds a head the loss never uses; ``--val-size N`` the evaluation set's size; ``--weighted`` draws the
training batches through a ``WeightedRandomSampler``; ``--save`` saves a checkpoint with ``fabric.save``;
``--leave-out-model`` sets up the optimizer alone (the mistake)."""

import argparse

import torch
from lightning_fabric import Fabric
from lightning_fabric.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

parser = argparse.ArgumentParser()
parser.add_argument("--strategy", choices=["ddp", "find-unused-true", "find-unused-false"], default="ddp")
parser.add_argument("--extra-head", action="store_true")
parser.add_argument("--val-size", type=int, default=32)
parser.add_argument("--weighted", action="store_true", help="train through a WeightedRandomSampler of 127 draws")
parser.add_argument("--save", action="store_true", help="fabric.save at the end")
parser.add_argument("--leave-out-model", action="store_true", help="the mistake: only the optimizer set up")
parser.add_argument("--epochs", type=int, default=2)
cli = parser.parse_args()


class Net(torch.nn.Module):
    def __init__(self, extra_head: bool):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.aux = torch.nn.Linear(32, 4) if extra_head else None  # a head for a task this loop never trains

    def forward(self, x):
        return self.body(x)


strategy = {"ddp": "ddp", "find-unused-true": DDPStrategy(find_unused_parameters=True),
            "find-unused-false": DDPStrategy(find_unused_parameters=False)}[cli.strategy]
fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
fabric.launch()
fabric.seed_everything(0)
train_set = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
val_set = TensorDataset(torch.randn(cli.val_size, 8), torch.randn(cli.val_size, 1))
model = Net(cli.extra_head)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
if cli.leave_out_model:
    optimizer = fabric.setup_optimizers(optimizer)
else:
    model, optimizer = fabric.setup(model, optimizer)
if cli.weighted:  # class balance: Fabric shards the sampler's draws (DistributedSamplerWrapper, shuffle=False)
    weights = torch.where(train_set.tensors[1][:, 0] > 0, 1.0, 3.0)
    train_loader = DataLoader(train_set, batch_size=16, sampler=WeightedRandomSampler(weights, num_samples=127))
else:
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True)
train_loader, val_loader = fabric.setup_dataloaders(train_loader, DataLoader(val_set, batch_size=16))
for epoch in range(cli.epochs):
    model.train()
    for x, y in train_loader:
        optimizer.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    model.eval()
    sums = torch.zeros(2)
    with torch.no_grad():
        for x, y in val_loader:
            sums += torch.stack([torch.nn.functional.mse_loss(model(x), y, reduction="sum"), torch.tensor(len(y))])
    sums = fabric.all_reduce(sums, reduce_op="sum")
    fabric.print(f"epoch {epoch} val {float(sums[0] / sums[1]):.6f} over {int(sums[1])}")
if cli.save:
    fabric.save("fabric.ckpt", {"model": model, "optimizer": optimizer})
fabric.barrier()
