"""benchmarks/fsdp_memory.py's counting (the runs themselves go through `mgpu launch`: tests/e2e covers fsdp)."""

from __future__ import annotations

import torch

from benchmarks.fsdp_memory import shard_bytes, tensor_bytes


def test_tensor_bytes_counts_every_tensor_of_a_nested_state_dict_but_scalars():
    state = {"model": {"w": torch.zeros(4, 8), "b": torch.zeros(8, dtype=torch.float64)},
             "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(4, 8)}},
                           "param_groups": [{"lr": 0.1, "params": [0]}]}}
    assert tensor_bytes(state) == 4 * 8 * 4 + 8 * 8 + 4 * 8 * 4


def test_shard_bytes_adds_up_each_ranks_files(tmp_path):
    for name, size in {"__0_0.distcp": 100, "__0_1.distcp": 20, "__1_0.distcp": 110, ".metadata": 999,
                       "meta.pt": 50}.items():
        (tmp_path / name).write_bytes(b"x" * size)
    assert shard_bytes(tmp_path) == {0: 120, 1: 110}
