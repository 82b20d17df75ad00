"""torch's moving parts (mgpucli/torch_parts.py): what mgpu replaces in torch is declared, and put back exactly."""

from __future__ import annotations

import pytest
import torch

from mgpucli import torch_parts


def test_only_a_declared_callable_can_be_replaced():
    before = torch.save
    with pytest.raises(KeyError, match="not in mgpucli.torch_parts.REPLACED"):
        torch_parts.replace("torch.load", lambda original: original)
    assert torch.save is before and all(path.startswith("torch.") for path in torch_parts.REPLACED)


@pytest.mark.parametrize("path", ["torch.Tensor.cuda", "torch.multiprocessing.start_processes"],
                         ids=["inherited from a base class", "the owner's own"])
def test_a_replacement_calls_through_and_is_undone_as_it_was(path):
    owner_path, _, name = path.rpartition(".")
    owner = torch_parts._resolve(owner_path)
    original, owned = getattr(owner, name), name in vars(owner)
    done = torch_parts.replace(path, lambda fn: lambda *args, **kwargs: ("wrapped", fn))
    try:
        assert getattr(owner, name)() == ("wrapped", original)
    finally:
        done.restore()
    assert getattr(owner, name) is original and (name in vars(owner)) == owned


def test_a_callable_this_torch_lacks_is_left_alone(monkeypatch):
    import torch.distributed as dist

    monkeypatch.delattr(dist, "monitored_barrier")
    assert torch_parts.replace("torch.distributed.monitored_barrier", lambda fn: fn) is None
