"""What reads a sharded checkpoint outside training: the weights into an unsharded model (validate, export), one
full file from the shards (``mgpu convert``), and the refusals. The shards are written here by
``torch.distributed.checkpoint`` in this one process, as a run's ranks write theirs."""

from __future__ import annotations

import pytest
import torch

from mgpucli.engine.checkpoints.files import read_file, save_atomic
from mgpucli.engine.checkpoints.sharded_readers import load_weights, to_full_file
from mgpucli.engine.checkpoints.state import build_payload
from mgpucli.errors import CheckpointError
from tests.inproc import cli

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


@pytest.fixture
def sharded(tmp_path):
    """A sharded checkpoint of a trained-looking model, its optimizer and an EMA of its parameters."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    ema = {name: p.detach() * 0 + 7 for name, p in model.named_parameters()}
    path = tmp_path / "checkpoints" / "step-00000003.dcp"
    dcp.save({"model": model_sd, "optimizer": optim_sd, "ema": ema}, checkpoint_id=str(path), no_dist=True)
    save_atomic({**build_payload(step=3, epoch=0, mid_epoch=True, world_size=2), "extra": ["ema"]}, path / "meta.pt")
    return path, model


def test_the_weights_load_into_an_unsharded_model_and_the_ema_replaces_only_the_parameters(sharded):
    path, trained = sharded
    fresh = _model()
    load_weights(fresh, path)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values(),
                                                 strict=True))
    load_weights(fresh, path, weights="ema")
    assert all(torch.equal(p, torch.full_like(p, 7)) for p in fresh.parameters())
    assert torch.equal(fresh[1].running_mean, trained[1].running_mean)  # a buffer: the model's own


def test_a_model_the_shards_do_not_fit_is_refused_with_the_keys(sharded):
    path, _ = sharded
    mismatch = r"shape mismatch \(1\): 0.weight \(checkpoint \(3, 4\), model \(3, 5\)\)"
    with pytest.raises(CheckpointError, match=mismatch):
        load_weights(torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.BatchNorm1d(3)), path)


def test_one_full_file_holds_the_meta_the_weights_the_optimizer_and_a_full_ema(sharded, tmp_path):
    path, trained = sharded
    to_full_file(path, tmp_path / "one.pt")
    full = read_file(tmp_path / "one.pt")
    assert full["step"] == 3 and "extra" not in full and not list(tmp_path.glob(".one.pt*"))
    assert all(torch.equal(full["model"][k], v) for k, v in trained.state_dict().items())
    assert set(full["optimizer"]["state"]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert full["ema"].keys() == full["model"].keys()  # as trainer.checkpoint_format=full writes it
    assert torch.equal(full["ema"]["0.weight"], torch.full((3, 4), 7.0))
    assert torch.equal(full["ema"]["1.running_var"], full["model"]["1.running_var"])


@pytest.mark.parametrize("args, problem", [
    (["missing.dcp", "out.pt"], "missing.dcp does not exist"),
    (["one.pt", "out.pt"], "one.pt is a file: it is one already"),
    (["checkpoints", "out.pt"], "checkpoints is a directory without meta.pt: not a sharded mgpu checkpoint"),
    (["checkpoints/step-00000003.dcp", "one.pt"], "one.pt exists; convert writes nothing over a file"),
    (["checkpoints/step-00000003.dcp", "no/such/out.pt"], "no/such is not a directory"),
])
def test_convert_refuses_what_it_cannot_read_or_write_with_exit_2(sharded, tmp_path, args, problem):
    (tmp_path / "one.pt").write_bytes(b"x")
    r = cli("convert", *args, cwd=tmp_path)
    assert r.returncode == 2 and problem in r.stderr and "Traceback" not in r.stderr, r.output


def test_validate_names_a_directory_that_is_no_sharded_checkpoint(tmp_path):
    r = cli("validate", ".", cwd=tmp_path)
    assert r.returncode == 2 and "is a directory without meta.pt" in r.stderr and "last.dcp" in r.stderr, r.output
