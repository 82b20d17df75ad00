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
from mgpucli.engine.data import GlobalOrderSampler, build_loaders, samples_consumed

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


def _order(world: int, consumed: int, epoch: int = 2, size: int = 103) -> list[list[int]]:
    """Every rank's indices for ``epoch`` of a sampler started after ``consumed`` samples."""
    out = []
    for rank in range(world):
        sampler = GlobalOrderSampler(range(size), num_replicas=world, rank=rank, shuffle=True, seed=3)
        sampler.resume_at(epoch, consumed)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
        assert len(out[-1]) == len(sampler)
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_starting_at_zero_is_torch_s_distributed_sampler(world):
    for rank in range(world):
        torch_s = DistributedSampler(range(103), num_replicas=world, rank=rank, shuffle=True, seed=3)
        torch_s.set_epoch(2)
        assert _order(world, 0)[rank] == list(torch_s)


@pytest.mark.parametrize("before, after, steps", [(2, 1, 3), (1, 2, 4), (4, 2, 1), (2, 4, 5)])
def test_a_resume_on_another_process_count_takes_each_remaining_sample_once_in_the_same_global_order(
        before, after, steps):
    """A global batch of 8: ``steps`` optimizer steps on ``before`` processes, the rest of the epoch on ``after``."""
    global_batch, size = 8, 96  # no padding: every sample exactly once
    full = [i for step in range(size // global_batch)
            for i in sorted(sum((r[step * global_batch // before:(step + 1) * global_batch // before]
                                 for r in _order(before, 0, size=size)), []))]
    first = _order(before, 0, size=size)
    consumed = steps * global_batch
    seen = [i for r in first for i in r[:consumed // before]]
    rest = _order(after, consumed, size=size)
    assert sorted(seen + [i for r in rest for i in r]) == list(range(size))
    per_rank = global_batch // after
    resumed = [i for step in range(len(rest[0]) // per_rank)
               for i in sorted(sum((r[step * per_rank:(step + 1) * per_rank] for r in rest), []))]
    assert full[consumed:] == resumed  # the same global batches, step by step


def test_the_resumed_epoch_is_padded_like_a_run_on_its_process_count_and_ends_at_the_train_set():
    whole = _order(3, 0)  # 103 samples on 3 processes: padded to 105 with the epoch's first samples
    assert _order(3, 21) == [r[7:] for r in whole]
    loader_data = build_loaders(DATA, None, CFG, seed=3, runtime=_rt(0, 2))
    sampler = loader_data.sampler
    sampler.set_epoch(2)
    sampler.resume_at(2, 40)
    assert samples_consumed(sampler, 2, 8) == 72 and samples_consumed(sampler, 5, 8) == 103
    assert _order(2, 103) == [[], []]


def test_a_loader_state_saved_in_a_resumed_epoch_continues_from_the_same_start():
    """A segment that started 32 samples into the epoch, stopped again on the same process count."""
    def loader():
        built = build_loaders(DATA, None, CFG, seed=3, runtime=_rt(1, 2))
        built.sampler.set_epoch(2)
        built.sampler.resume_at(2, 32)
        return built.train
    first = loader()
    it = iter(first)
    seen = [next(it)[1].tolist() for _ in range(2)]
    state, rest = first.state_dict(), _targets(it)
    fresh = loader()
    fresh.load_state_dict(state)
    assert _targets(iter(fresh)) == rest and len(seen + rest) == len(fresh) == 5  # ceil((103 - 32) / 2 / 8)
