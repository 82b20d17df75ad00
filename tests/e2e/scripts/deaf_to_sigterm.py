"""Rank 1 raises while rank 0 is busy in its own code, with a SIGTERM handler that lets it go on."""

import signal
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    signal.signal(signal.SIGTERM, lambda signum, frame: print("rank 0 goes on despite SIGTERM", flush=True))
    time.sleep(300)
else:
    time.sleep(1)
    raise ValueError("rank one broke")
