"""The ranks disagree on the number of all_reduce calls (as with uneven batches per rank): rank 0 makes one more,
and its last one has no partner while rank 1 already waits at the closing barrier."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
batches = 3 if dist.get_rank() == 0 else 2
for _ in range(batches):
    dist.all_reduce(torch.ones(1))  # rank 0's third call has no partner
dist.barrier()
dist.destroy_process_group()
