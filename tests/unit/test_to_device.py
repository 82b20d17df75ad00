"""Batches reach the training device whole: nested lists, tuples and dicts of tensors are moved, the rest kept."""

from __future__ import annotations

import torch

from mgpucli.engine.data import to_device

META = torch.device("meta")  # stands in for a GPU: moving to it is real, copying data is not


def test_every_tensor_of_a_nested_batch_is_moved_and_the_structure_kept():
    batch = (torch.ones(2, 3), [torch.zeros(2, dtype=torch.long), {"mask": torch.ones(2)}], "id-7")
    x, (y, extra), label = to_device(batch, META, non_blocking=False)
    assert (x.device, y.device, extra["mask"].device) == (META, META, META)
    assert x.shape == (2, 3) and y.dtype == torch.long and label == "id-7"


def test_a_cpu_tensor_on_the_cpu_is_the_same_tensor():
    single = torch.ones(3)
    assert to_device(single, torch.device("cpu"), non_blocking=False) is single


def test_tasks_take_their_loss_in_float32_whatever_the_outputs_dtype():
    from mgpucli.engine.tasks import Classification

    half = torch.randn(4, 3).to(torch.bfloat16)
    targets = torch.tensor([0, 1, 2, 0])
    assert torch.equal(Classification().loss(half, targets), torch.nn.functional.cross_entropy(half.float(), targets))
