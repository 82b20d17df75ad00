"""A torchrun-style script written for GPUs, as the tutorials have it: set_device(LOCAL_RANK), nccl, an all-reduce
on the GPU. On CPU workers (--cpu hides the GPUs) it fails, and the post-mortem must say why."""

import json
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
total = torch.ones(1, device="cuda")
dist.all_reduce(total)
print(json.dumps({"rank": dist.get_rank(), "sum": total.item(), "visible": torch.cuda.device_count()}), flush=True)
dist.barrier()
dist.destroy_process_group()
