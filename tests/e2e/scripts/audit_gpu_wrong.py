"""The tutorial's device mistakes on 2 GPUs, for ``mgpu launch --gpus 2 --audit``: NCCL initialised before
``torch.cuda.set_device(local_rank)``, and the model and the batches moved with ``.cuda()``, which lands on cuda:0 in
every rank. It runs no NCCL collective (two ranks on one GPU would fail there) and exits 0."""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")  # TRAP no_set_device
model = torch.nn.Linear(8, 1).cuda()  # TRAP device_cuda0
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
    optimizer.step()
torch.cuda.synchronize()
dist.destroy_process_group()
