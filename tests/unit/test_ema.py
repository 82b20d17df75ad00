"""The weights' moving average (engine/ema.py): its schedule, the swap for validation, its checkpoint state, on
a plain module and on an FSDP-sharded one (a gloo group of one)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mgpucli.engine.checkpoints.state import model_state
from mgpucli.engine.ema import EMA


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.norm = nn.Linear(4, 8), nn.BatchNorm1d(8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 2)])

    def forward(self, x):
        x = self.norm(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return x


def net() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def nudge(model: nn.Module, amount: float) -> None:
    """What an optimizer step does to the weights, as far as the average can tell."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_the_average_follows_decay_every_and_start_step():
    model = net()
    first = weights(model)
    ema = EMA(model, decay=0.5, every=2, start_step=2)
    nudge(model, 1.0)
    ema.update(1)  # up to start_step: the weights themselves
    assert all(torch.equal(a, p) for a, p in zip(ema.shadow, model.parameters(), strict=True))
    nudge(model, 1.0)
    ema.update(2)
    nudge(model, 1.0)
    ema.update(3)  # (3 - 2) % 2: no update
    for a, f in zip(ema.shadow, first, strict=True):
        torch.testing.assert_close(a, f + 2.0)
    ema.update(4)  # halfway between f + 2 and the weights, f + 3
    for a, f in zip(ema.shadow, first, strict=True):
        torch.testing.assert_close(a, f + 2.5)


def test_validation_sees_the_average_and_the_weights_come_back_bitwise():
    model = net()
    ema = EMA(model, decay=0.9)
    nudge(model, 0.1)
    before = weights(model)
    with ema.swapped_in():
        assert all(torch.equal(p, a) for p, a in zip(model.parameters(), ema.shadow, strict=True))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_checkpoint_state_is_the_model_state_with_averaged_parameters():
    model = net()
    ema = EMA(model, decay=0.9)
    nudge(model, 1.0)
    ema.update(1)
    state = {k: v.clone() for k, v in ema.full_state(model_state(model)).items()}
    assert list(state) == list(model.state_dict())  # buffers too: it loads into the model like `model` does
    assert torch.equal(state["norm.running_mean"], model.state_dict()["norm.running_mean"])
    torch.testing.assert_close(state["inp.weight"], ema.shadow[0])
    again = EMA(model, decay=0.9)
    again.load_full_state(state)
    assert all(torch.equal(a, b) for a, b in zip(again.shadow, ema.shadow, strict=True))


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_under_fsdp_the_average_is_sharded_like_the_weights(group_of_one):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = net()
    plain = EMA(net(), decay=0.5)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    ema = EMA(model, decay=0.5)
    assert ema.sharded and all(isinstance(a, DTensor) for a in ema.shadow)
    nudge(model, 1.0)
    nudge(plain.model, 1.0)
    ema.update(1)
    plain.update(1)
    full = ema.full_state(model_state(model))
    expected = plain.full_state(model_state(plain.model))
    assert full.keys() == expected.keys()
    assert all(torch.equal(full[k], expected[k]) for k in full)
    x = torch.randn(3, 4)
    model.eval(), plain.model.eval()
    with plain.swapped_in():
        expected_out = plain.model(x)
    model(x)  # gathers the parameters; FSDP keeps the root's after a forward
    before = [p.full_tensor() for p in ema.params]  # the sharded parameters (model.parameters() are gathered now)
    with ema.swapped_in():
        assert torch.equal(model(x), expected_out)  # the forward saw the average, not what was gathered before
    assert all(torch.equal(p.full_tensor(), b) for p, b in zip(ema.params, before, strict=True))
    assert torch.equal(model(x), plain.model(x))  # and the weights again afterwards
    model.reshard()  # its sharded parameters registered again, as they are when the trainer builds its EMA
    again = EMA(model, decay=0.5)
    again.load_full_state(full)
    assert all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(again.shadow, ema.shadow, strict=True))

