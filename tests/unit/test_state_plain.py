"""engine/state.py's plain path (no torch.distributed.checkpoint) against dcp's own results.

For plain modules (bare, DDP, DataParallel, torch.compile'd, a compiled submodule) the plain save functions must
return what dcp's get_model_state_dict / get_optimizer_state_dict (full_state_dict, cpu_offload) return: the same
keys in the same order, the same container types, equal tensors of the same dtype and device, sharing storage
with the same live tensors; and what they save must load (through dcp, as every load does) to dcp's own result.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mgpucli.engine import state as st

ROOT = Path(__file__).resolve().parents[2]


# dcp itself and the options mgpu passes it (the reference path, used for FSDP and for every load)
_dcp, _full, _load = st._dcp, st._full, st._load


# ------------------------------------------------------------------------------------------------ comparing
def assert_same(a, b, storage: bool = False, path: str = "") -> None:
    """Same structure (types, key order), equal tensors (dtype, device, shape, requires_grad); with ``storage``
    the tensors must also be views of the same memory."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], storage, f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, storage, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.device, a.shape, a.requires_grad) == (b.dtype, b.device, b.shape, b.requires_grad), path
        assert torch.equal(a, b), f"{path}: values differ"
        if storage:
            assert _shares(a, b), f"{path}: not the same memory"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr(), a.storage_offset()) == (b.untyped_storage().data_ptr(),
                                                                     b.storage_offset())


@pytest.mark.parametrize("other", [
    {"w": torch.ones(2), "z": 1},                   # a wrong key
    {"w": torch.tensor([1.0, 2.0]), "v": 1},        # a wrong value
    {"w": torch.ones(2, dtype=torch.float64), "v": 1},
    {"v": 1, "w": torch.ones(2)},                   # another key order
    {"w": torch.ones(2), "v": [1]},                 # another container
])
def test_the_comparison_catches_differences(other):
    with pytest.raises(AssertionError):
        assert_same({"w": torch.ones(2), "v": 1}, other)
    with pytest.raises(AssertionError):
        assert_same({"t": (0.9, 0.99)}, {"t": [0.9, 0.99]})
    with pytest.raises(AssertionError):
        assert_same({"w": torch.ones(2)}, {"w": torch.ones(2)}, storage=True)


# ------------------------------------------------------------------------------------------------ models
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.body(x)


class BNNet(nn.Module):
    """Buffers: BatchNorm's (running stats, num_batches_tracked), a persistent and a non-persistent one; and a
    frozen parameter that the optimizer holds but never updates."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 2)
        self.offset = nn.Parameter(torch.full((4,), 0.5), requires_grad=False)
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x):
        return self.out(self.bn(self.fc(x)) * self.scale + self.offset)


class Tied(nn.Module):
    """The output layer shares the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.norm(self.emb(x)))


MODELS = {"mlp": MLP, "bn": BNNet, "tied": Tied}


def _batch(kind: str, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 16, (8, 5), generator=g) if kind == "tied" else torch.randn(8, 6, generator=g)


def _optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    """Two parameter groups with their own settings."""
    params = list(model.parameters())
    first, rest = params[: len(params) // 2], params[len(params) // 2:]
    if kind == "sgd":
        return torch.optim.SGD([{"params": first, "lr": 0.1}, {"params": rest}], lr=0.05, momentum=0.9,
                               nesterov=True, weight_decay=1e-4)
    return torch.optim.AdamW([{"params": first, "lr": 0.01, "betas": (0.8, 0.95)},
                              {"params": rest, "weight_decay": 0.0}], lr=0.003)


@pytest.fixture
def process_group():
    """A one-process gloo group (for DDP)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _setup(request, model_kind: str, wrapper: str, optim_kind: str, seed: int, steps: int):
    """(model as passed to the state functions, the bare model, optimizer), after ``steps`` training steps."""
    if wrapper == "ddp":
        request.getfixturevalue("process_group")
    torch.manual_seed(seed)
    model = MODELS[model_kind]()
    outer = model
    if wrapper == "ddp":
        outer = nn.parallel.DistributedDataParallel(model)
    elif wrapper == "dp":
        outer = nn.DataParallel(model)
    opt = _optimizer(optim_kind, model)
    for step in range(steps):
        outer(_batch(model_kind, step)).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if wrapper == "compiled":  # wrapped after training: nothing is ever compiled
        outer = torch.compile(model)
    elif wrapper == "inner_compiled":
        name = next(iter(model._modules))
        setattr(model, name, torch.compile(getattr(model, name)))
    return outer, model, opt


MODEL_KINDS = list(MODELS)
WRAPPERS = ["bare", "ddp", "dp", "compiled", "inner_compiled"]
OPTIMS = ["sgd", "adamw"]
combos = pytest.mark.parametrize("model_kind,wrapper,optim_kind", [
    (m, w, o) for m in MODEL_KINDS for w in WRAPPERS for o in OPTIMS])


# ------------------------------------------------------------------------------------------------ saving
@combos
def test_saved_state_is_dcps(request, model_kind, wrapper, optim_kind):
    outer, model, opt = _setup(request, model_kind, wrapper, optim_kind, seed=0, steps=3)
    assert not st.needs_dcp(outer)
    want_model = _dcp().get_model_state_dict(outer, options=_full())
    want_optim = _dcp().get_optimizer_state_dict(outer, opt, options=_full())
    got_model, got_optim = st._plain_model_state(outer), st._plain_optimizer_state(outer, opt)
    assert want_model and want_optim["state"]
    assert_same(got_model, want_model, storage=True)  # CPU tensors: both alias the live ones
    assert_same(got_optim, want_optim, storage=True)
    bare_names = [k.replace("._orig_mod", "") for k in model.state_dict()]
    if wrapper == "dp":  # dcp keeps DataParallel's prefix
        assert list(got_model) == [f"module.{k}" for k in bare_names]
    else:
        assert sorted(got_model) == sorted(bare_names)
    with torch.no_grad():  # mutating the model shows in both results alike (dcp's do not copy CPU tensors)
        for t in (*model.parameters(), *model.buffers()):
            t.add_(1)
    assert_same(got_model, want_model)
    assert_same(got_model, {k: v.to("cpu") for k, v in _dcp().get_model_state_dict(
        outer, options=_full()).items()})


def test_saved_names_strip_wrappers_and_keep_tied_and_buffers(request):
    outer, model, opt = _setup(request, "tied", "compiled", "adamw", seed=0, steps=2)
    state = st._plain_model_state(outer)
    assert list(state) == ["emb.weight", "norm.weight", "norm.bias", "head.weight"]
    assert _shares(state["emb.weight"], state["head.weight"])
    optim = st._plain_optimizer_state(outer, opt)
    assert set(optim["state"]) == {"emb.weight", "norm.weight", "norm.bias"}  # the tied weight once
    assert [g["params"] for g in optim["param_groups"]] == [["emb.weight"], ["norm.weight", "norm.bias"]]
    bn = st._plain_model_state(_setup(request, "bn", "bare", "sgd", seed=0, steps=1)[0])
    assert "bn.num_batches_tracked" in bn and "scale" in bn and "scratch" not in bn and "offset" in bn


@pytest.mark.parametrize("model_kind", MODEL_KINDS)
@pytest.mark.parametrize("optim_kind", OPTIMS)
@pytest.mark.parametrize("wrapper", ["bare", "ddp"])
def test_saving_a_fresh_optimizer_initialises_it_as_dcp_does(request, model_kind, optim_kind, wrapper):
    a = _setup(request, model_kind, wrapper, optim_kind, seed=1, steps=0)
    b = _setup(request, model_kind, wrapper, optim_kind, seed=1, steps=0)
    want = _dcp().get_optimizer_state_dict(a[0], a[2], options=_full())
    got = st._plain_optimizer_state(b[0], b[2])
    assert want["state"]  # dcp stepped the optimizer once on zero gradients
    assert_same(got, want)
    assert_same(b[2].state_dict(), a[2].state_dict())
    assert_same(dict(b[1].named_parameters()), dict(a[1].named_parameters()))
    assert all(p.grad is None for p in b[1].parameters())


def test_other_ranks_get_an_empty_state_like_dcp(request, monkeypatch):
    request.getfixturevalue("process_group")
    a = _setup(request, "bn", "bare", "adamw", seed=1, steps=0)
    b = _setup(request, "bn", "bare", "adamw", seed=1, steps=0)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    assert _dcp().get_model_state_dict(a[0], options=_full()) == {} == st._plain_model_state(b[0])
    assert _dcp().get_optimizer_state_dict(a[0], a[2], options=_full()) == {}
    assert st._plain_optimizer_state(b[0], b[2]) == {}
    assert_same(b[2].state_dict(), a[2].state_dict())  # initialised on every rank all the same


# ------------------------------------------------------------------------------------------------ loading
@pytest.mark.parametrize("optim_kind", OPTIMS)
def test_public_functions_round_trip_a_checkpoint_file_like_dcp(request, tmp_path, optim_kind):
    """What the plain path saves, mgpu's loader (dcp) restores to the state dcp's own save would restore."""
    src = _setup(request, "bn", "bare", optim_kind, seed=0, steps=3)
    torch.save({"model": st.model_state(src[0]), "optimizer": st.optimizer_state(src[0], src[2])},
               tmp_path / "c.pt")
    a = _setup(request, "bn", "bare", optim_kind, seed=1, steps=0)
    b = _setup(request, "bn", "bare", optim_kind, seed=1, steps=0)
    ckpt_a = torch.load(tmp_path / "c.pt", weights_only=True)
    ckpt_b = torch.load(tmp_path / "c.pt", weights_only=True)
    _dcp().set_model_state_dict(a[0], ckpt_a["model"], options=_load())
    _dcp().set_optimizer_state_dict(a[0], a[2], optim_state_dict=ckpt_a["optimizer"], options=_load())
    st.load_model_state(b[0], ckpt_b["model"], "c.pt")
    st.load_optimizer_state(b[0], b[2], ckpt_b["optimizer"])
    assert_same(b[0].state_dict(), a[0].state_dict())
    assert_same(b[2].state_dict(), a[2].state_dict())
    assert_same(dict(b[0].state_dict()), dict(src[0].state_dict()))


# ------------------------------------------------------------------------------------------------ routing
def test_fsdp_models_take_dcp(request):
    request.getfixturevalue("process_group")
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = MLP()
    fully_shard(model.body[0])
    fully_shard(model)
    assert st.needs_dcp(model)
    assert_same(st.model_state(model), _dcp().get_model_state_dict(model, options=_full()))
    inner = nn.Sequential(nn.Linear(2, 2))
    fully_shard(inner[0])
    assert st.needs_dcp(inner)  # a sharded submodule is enough


def test_plain_models_do_not_take_dcp(request):
    for wrapper in WRAPPERS:
        assert not st.needs_dcp(_setup(request, "bn", wrapper, "sgd", seed=0, steps=0)[0]), wrapper
    with torch.device("meta"):
        assert st.needs_dcp(MLP())


def test_sgd_without_momentum_resumes():
    """No per-parameter state at all: dcp's loader fails on it (AssertionError in torch 2.13), which made resuming
    a recipe with plain SGD crash; the groups' settings are restored instead."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(_batch("mlp", 0)).sum().backward()
    opt.step()
    saved = st.optimizer_state(model, opt)
    assert saved["state"] == {}
    saved["param_groups"][0]["lr"] = 0.25
    fresh = torch.optim.SGD(model.parameters(), lr=0.1)
    st.load_optimizer_state(model, fresh, saved)
    assert fresh.param_groups[0]["lr"] == 0.25 and not fresh.state
    assert fresh.param_groups[0]["params"] == list(model.parameters())
