"""A torchrun-style script whose rank 1 raises in the user's own code, without torch's ``@record``: the launcher
must still show rank 1's exception and traceback."""

import torch
import torch.distributed as dist


def load_batch(step: int) -> torch.Tensor:
    if dist.get_rank() == 1 and step == 2:
        raise ValueError(f"corrupt sample 17 in shard {step}")
    return torch.ones(4)


dist.init_process_group("gloo")
for step in range(5):
    batch = load_batch(step)
    dist.all_reduce(batch)
dist.destroy_process_group()
