"""Rank 1 joins, then is stuck in its own code (a read that never answers) while rank 0 waits for it in all_reduce."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(3600)  # stuck here
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
