"""Calls mgpucli.progress(step) every step; rank 1 stops arriving at step 3, so rank 0's all-reduce times out (the
process group's timeout is 3 s): the timeout must name the step each rank had reached."""

import datetime
import time

import torch
import torch.distributed as dist

import mgpucli

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
for step in range(1, 6):
    if dist.get_rank() == 1 and step == 3:
        time.sleep(120)
    mgpucli.progress(step)
    time.sleep(1.5)  # the heartbeats are published every second
    dist.all_reduce(torch.ones(1))
