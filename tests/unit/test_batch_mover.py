"""The step path's batch mover: on the CPU a batch of CPU tensors is passed through as it is; everything else
is moved by to_device, as before."""

from __future__ import annotations

import pytest
import torch

from mgpucli.engine.data import batch_mover

CPU = torch.device("cpu")


def test_a_cpu_batch_of_cpu_tensors_is_passed_through_untouched():
    move = batch_mover(CPU, non_blocking=False)
    for batch in ([torch.ones(2, 3), torch.zeros(2, dtype=torch.long)], (torch.ones(1), torch.ones(1))):
        assert move(batch) is batch


def test_anything_else_on_the_cpu_goes_through_to_device():
    move = batch_mover(CPU, non_blocking=False)
    nested = [torch.ones(2), {"mask": torch.ones(2)}]
    moved = move(nested)
    assert moved is not nested and torch.equal(moved[1]["mask"], nested[1]["mask"])
    as_dict = {"x": torch.ones(2)}
    assert move(as_dict) is not as_dict and torch.equal(move(as_dict)["x"], as_dict["x"])
    assert move((torch.ones(2), ["a", "b"]))[1] == ["a", "b"]
    single = torch.ones(3)
    assert move(single) is single  # .to on the same device returns the tensor itself


def test_a_tensor_on_another_device_is_not_passed_through():
    """A meta tensor stands in for one on a GPU: the mover must try to copy it (which a meta tensor refuses)."""
    move = batch_mover(CPU, non_blocking=False)
    with pytest.raises(NotImplementedError, match="meta"):
        move([torch.ones(2), torch.empty(2, device="meta")])


def test_other_devices_move_every_tensor():
    move = batch_mover(torch.device("meta"), non_blocking=False)
    x, y = move((torch.ones(2, 3), torch.zeros(2, dtype=torch.long)))
    assert x.device.type == "meta" and y.device.type == "meta" and x.shape == (2, 3)


def test_tasks_convert_to_float32_only_where_needed():
    from mgpucli.engine.tasks import Classification, _f32

    out = torch.randn(4, 3)
    assert _f32(out) is out
    half = out.to(torch.bfloat16)
    assert _f32(half).dtype == torch.float32
    targets = torch.tensor([0, 1, 2, 0])
    assert torch.equal(Classification().loss(half, targets),
                       torch.nn.functional.cross_entropy(half.float(), targets))
