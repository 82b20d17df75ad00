"""The train loader's mid-epoch state: saved after k batches and loaded into a fresh loader (as a resume does),
the fresh loader yields exactly the batches the first one had left, on every rank; and a state saved by the
loader of earlier versions (torchdata's own stateful batch sampler) resumes the same way."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from mgpucli.distributed.env import RankEnv
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.data import build_loaders

DATA = TensorDataset(torch.arange(103, dtype=torch.float32).unsqueeze(1), torch.arange(103))
CFG = OmegaConf.create({"batch_size": 8, "num_workers": 0, "pin_memory": "auto", "shuffle": True,
                        "drop_last": False, "val_batch_size": None})


def _rt(rank: int, world: int) -> Runtime:
    env = RankEnv(rank=rank, local_rank=rank, world_size=world, local_world_size=world)
    return Runtime(env=env, device=torch.device("cpu"), backend=None, cpu_threads=1)


def _targets(batches) -> list[list[int]]:
    return [y.tolist() for _, y in batches]


@pytest.mark.parametrize("rank, world, taken", [(0, 1, 5), (1, 2, 3), (0, 2, 6)])
def test_a_loaded_state_continues_where_the_saved_loader_stopped(rank, world, taken):
    whole = build_loaders(DATA, None, CFG, seed=3, runtime=_rt(rank, world))
    whole.sampler.set_epoch(2)
    expected = _targets(iter(whole.train))
    first = build_loaders(DATA, None, CFG, seed=3, runtime=_rt(rank, world))
    first.sampler.set_epoch(2)
    it = iter(first.train)
    seen = [next(it)[1].tolist() for _ in range(taken)]
    state = first.train.state_dict()
    fresh = build_loaders(DATA, None, CFG, seed=3, runtime=_rt(rank, world))
    fresh.sampler.set_epoch(2)
    fresh.train.load_state_dict(state)
    assert seen + _targets(iter(fresh.train)) == expected and len(expected) == len(first.train)


def test_a_state_saved_by_torchdata_s_batch_sampler_still_resumes():
    """Checkpoints of earlier versions hold the state of StatefulDataLoader(batch_size=..., sampler=...)."""
    sampler = DistributedSampler(DATA, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(1)
    old = StatefulDataLoader(DATA, batch_size=8, sampler=sampler)
    it = iter(old)
    seen = [next(it)[1].tolist() for _ in range(4)]
    state = old.state_dict()
    rest_old = _targets(it)
    fresh = build_loaders(DATA, None, CFG, seed=3, runtime=_rt(1, 2))
    fresh.sampler.set_epoch(1)
    fresh.train.load_state_dict(state)
    assert _targets(iter(fresh.train)) == rest_old and len(seen + rest_old) == len(fresh.train)
