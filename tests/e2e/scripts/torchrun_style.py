"""A torchrun-style script: it reads LOCAL_RANK/RANK/WORLD_SIZE from the environment. Prints the arguments it got,
so tests can check that everything after the script reaches it untouched."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(json.dumps({"rank": rank, "local_rank": local_rank, "world": world, "argv": sys.argv[1:],
                  "run_dir": os.environ.get("MGPU_RUN_DIR")}), flush=True)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(5):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
dist.destroy_process_group()
