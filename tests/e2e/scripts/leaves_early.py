"""Rank 1 leaves (exit code 0) while rank 0 waits for it in a barrier."""

import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(1)  # rank 0 is in the barrier by now
    os._exit(0)
dist.barrier()
print("never printed")
