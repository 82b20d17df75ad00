"""A torchrun-style script whose rank 1 blocks (as on a network file that never answers) while rank 0 waits in an
all-reduce with a 10 s timeout: rank 0 fails, and rank 1's stack must show where it was stuck."""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=10))
if dist.get_rank() == 1:
    time.sleep(3600)  # stuck here
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
print("never reached on rank 0", os.environ.get("RANK"))
