"""Rank 1 never calls init_process_group: it is stuck loading its data, while rank 0 waits in init_process_group."""
import os
import time

import torch
import torch.distributed as dist


def load_data():
    if os.environ["RANK"] == "1":
        time.sleep(3600)  # a read that never answers
    return torch.ones(4)


data = load_data()
dist.init_process_group("gloo")
dist.all_reduce(data)
dist.destroy_process_group()
