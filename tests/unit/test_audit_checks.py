"""``mgpu launch --audit``: each check's logic in one process, two ranks played by two sessions sharing one store.

The checks are driven through their methods (no ``install()``: torch is never patched here), with real torch objects
(DataLoader, DistributedSampler, optimizers, DDP on a group of one) and a HashStore standing in for the rendezvous
store. Each session writes its rank's findings file under the test's directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Subset, TensorDataset

from mgpucli.audit import devices, divergence, libraries, loaders, samplers, saves, unused
from mgpucli.audit.session import Session
from mgpucli.audit.where import user_where
from mgpucli.run_records.audit_records import Where, read_file
from tests.unit import test_ema


def found(session: Session) -> list:
    return read_file(session.path)[0]


def kinds(*sessions: Session) -> list[str]:
    return sorted(f.kind for s in sessions for f in found(s))


# ------------------------------------------------------------------------------------------ the session
def test_meet_gives_every_value_to_the_last_rank_to_arrive_and_nobody_waits(ranks):
    a, b, c = ranks(3)
    assert a.meet("k", {"v": 1}) is None and c.meet("k", [2]) is None  # rank 1 has not come: nobody waits
    assert b.meet("k", "x") == [{"v": 1}, "x", [2]]  # the last one compares, in rank order
    assert a.meet("other", 1) is None  # a key that not every rank reaches stays short, harmlessly
    assert a.store().num_keys() == 2  # only the short one's value and count: a completed meet leaves nothing


def test_a_finding_is_written_once_per_kind_and_place_and_the_status_says_what_was_checked(ranks):
    (s, _) = ranks(2)
    where = Where("/w/train.py", 12, "<module>", "loader = DataLoader(ds)")
    assert s.report("loader_not_distributed", "t", "c", "f", where)
    assert not s.report("loader_not_distributed", "t again", "c", "f", where)
    assert s.report("loader_not_distributed", "t", "c", "f", Where("/w/train.py", 13))
    s.count("data loaders", 2)
    s.note("something could not be checked")
    s.finish(clean=True)
    findings, statuses = read_file(s.path)
    assert [(f.rank, f.where.line) for f in findings] == [(0, 12), (0, 13)]
    assert findings[0].where.code == "loader = DataLoader(ds)" and findings[0].attempt == 0
    (status,) = statuses
    assert status["checked"] == {"data loaders": 2} and status["notes"] == ["something could not be checked"]


def test_an_unreachable_store_is_a_note_and_no_finding(tmp_path):
    env = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}
    s = Session(env)  # no MASTER_ADDR/MASTER_PORT
    assert s.meet("k", 1) is None
    s.finish(clean=True)
    findings, (status,) = read_file(s.path)
    assert findings == [] and "cross-rank checks skipped" in status["notes"][0]


def test_without_a_findings_file_a_finding_goes_to_stderr(capsys):
    s = Session({"RANK": "1", "WORLD_SIZE": "2"})
    s.report("same_save_path", "title", "cost", "fix", None)
    assert '"kind": "same_save_path"' in capsys.readouterr().err


def test_the_users_line_is_the_innermost_frame_outside_torch_the_stdlib_and_mgpu(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import mgpucli.audit.where as w\ndef make():\n    return w.user_where()\nwhere = make()\n")
    space: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), space)
    assert space["where"] == Where(str(script), 3, "make", "return w.user_where()")
    assert user_where().file == __file__  # called from here, this test file is the user's code


def test_without_the_users_code_on_the_stack_the_place_is_the_librarys_that_made_the_call():
    from mgpucli.audit.where import where_in
    from mgpucli.run_records.stacks import Frame

    site = "/venv/lib/python3.11/site-packages"
    mgpu = str(Path(samplers.__file__))
    frames = [Frame(mgpu, 60, "__init__"), Frame(f"{site}/torch/utils/data/sampler.py", 30, "__init__"),
              Frame(f"{site}/peerlib/data.py", 12, "shard"), Frame(f"{site}/peerlib/cli.py", 3, "main"),
              Frame("/usr/lib/python3.11/runpy.py", 88, "_run_code")]
    where = where_in(frames)
    assert (where.file, where.line, where.library) == (f"{site}/peerlib/data.py", 12, "peerlib")
    assert where.cite() == "peerlib/data.py:12 (peerlib's code)"
    assert where_in(frames[:2] + frames[4:]).library == "torch"  # torch's own frame, when nothing else is there
    assert where_in([Frame("/w/train.py", 7, "main"), *frames]).library == ""  # the user's line, whenever there is one
    assert where_in([frames[0], frames[4]]) is None


# ------------------------------------------------------------------------------------------ divergence
def test_comparisons_double_up_to_64_then_every_64_and_a_backed_off_rank_meets_the_others():
    steps, at = [], 0
    while at < 400:
        at = divergence.next_check(at)
        steps.append(at)
    assert steps[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 192, 256]
    slow = set()
    at = 0
    while at < 2000:
        at = divergence.next_check(at, backoff=256)
        slow.add(at)
    fast = set()
    at = 0
    while at < 2000:
        at = divergence.next_check(at)
        fast.add(at)
    assert slow <= fast and {256, 512, 768} <= slow and 192 not in slow  # nested: they still meet


def test_a_comparison_that_costs_more_than_its_budget_backs_off_by_powers_of_two():
    assert divergence.backoff_for(cost_s=0.001, step_s=None, backoff=1, steps=2) == 1  # no step time yet
    assert divergence.backoff_for(cost_s=0.0001, step_s=0.1, backoff=1, steps=64) == 1  # 0.1 ms per 64 x 100 ms
    assert divergence.backoff_for(cost_s=0.05, step_s=0.01, backoff=1, steps=64) == 1024  # needs 1000 steps
    assert divergence.backoff_for(cost_s=0.05, step_s=0.01, backoff=2048, steps=64) == 2048  # never goes back


def test_fingerprints_are_equal_for_equal_parameters_and_differ_otherwise():
    torch.manual_seed(0)
    a = torch.nn.Linear(6, 3)
    b = torch.nn.Linear(6, 3)
    b.load_state_dict(a.state_dict())
    state = torch.get_rng_state()
    fa = divergence.fingerprint(list(a.parameters()))[0].result()
    assert torch.equal(torch.get_rng_state(), state)  # no RNG draw
    assert fa == divergence.fingerprint(list(b.parameters()))[0].result() and len(fa) == 4
    with torch.no_grad():
        b.bias[1] += 1e-6
    assert fa != divergence.fingerprint(list(b.parameters()))[0].result()
    assert divergence.groups([fa, fa, [0.0], fa]) == [[0, 1, 3], [2]]
    assert divergence.agreement([[0], [1]]) == "no two ranks agree"
    assert divergence.agreement([[0, 2], [1]]) == "ranks 0, 2 agree; rank 1 alone"


@pytest.fixture
def no_backoff(monkeypatch):
    """Comparisons on the schedule, however slow a fingerprint is next to these microsecond steps."""
    monkeypatch.setattr(divergence, "BUDGET", 1e9)


def _divergence(session: Session) -> divergence.Divergence:
    """The check as install() sets it up, without the global hook: steps are counted by calling it."""
    check = divergence.Divergence(session)
    session.at_finish(check.finish)
    return check


def _stepped(check: divergence.Divergence, opt: torch.optim.Optimizer, model: torch.nn.Module, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        check.after_step(opt, (), {})


def test_a_model_trained_apart_on_each_rank_is_found_at_the_first_comparison(ranks, no_backoff):
    s0, s1 = ranks(2)
    checks = [_divergence(s0), _divergence(s1)]
    models = []
    for rank in (1, 0):
        torch.manual_seed(rank)  # different weights: nothing synchronises them
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _stepped(checks[rank], opt, model, 3)
        models.append((model, opt))
    s0.finish(clean=True)
    s1.finish(clean=True)  # the last to finish compares the end: it need not say it again
    # each session compares on its own thread: whichever rank's comparison of step 1 comes last reports it, once
    (f,) = found(s0) + found(s1)
    assert f.kind == "params_diverged" and "not wrapped in DistributedDataParallel" in f.title
    assert f.details == {"optimizer": 0, "step": 1, "groups": [[0], [1]], "ddp": False}
    assert "DDP(model" in f.fix


def test_the_same_training_on_every_rank_is_no_finding_and_different_step_counts_are(ranks, no_backoff):
    s0, s1 = ranks(2)
    checks = [_divergence(s0), _divergence(s1)]
    for steps, s, check in ((5, s0, checks[0]), (3, s1, checks[1])):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        _stepped(check, torch.optim.SGD(model.parameters(), lr=0.1), model, steps)
        s.finish(clean=True)
    (f,) = found(s1)
    assert f.kind == "optimizer_steps_differ" and "(rank 0: 5, rank 1: 3)" in f.title
    assert f.details["unmatched_checks"] == [4] and f.where.file == __file__
    assert "comparison at step 4 was never completed: rank 1 never got there" in f.cost and "nothing hung" in f.cost


def test_a_rank_that_never_stepped_names_the_optimizer_where_another_rank_built_it(ranks, no_backoff):
    s0, s1 = ranks(2)
    check = _divergence(s0)
    _divergence(s1)
    model = torch.nn.Linear(4, 1)
    _stepped(check, torch.optim.SGD(model.parameters(), lr=0.1), model, 3)
    s0.finish(clean=True)
    s1.finish(clean=True)  # rank 1 compares, with no optimizer of its own
    (f,) = found(s1)
    assert f.kind == "optimizer_steps_differ" and "(rank 0: 3, rank 1: 0)" in f.title
    assert f.where is not None and f.where.file == __file__ and f.where.library == ""


def test_equal_training_is_no_finding_and_a_ddp_models_divergence_blames_a_step(ranks, no_backoff):
    s0, s1 = ranks(2)
    checks = [_divergence(s0), _divergence(s1)]
    for rank, (s, check) in enumerate(zip((s0, s1), checks, strict=True)):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        s.ddp_params.update(id(p) for p in model.parameters())  # as if wrapped in DDP
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _stepped(check, opt, model, 4)
        if rank == 1:
            with torch.no_grad():
                model.bias += 1  # changed on one rank alone, after the last comparison
        s.finish(clean=True)
    (f,) = found(s1)
    assert f.kind == "params_diverged" and "of a DDP model" in f.title and "at the end of the script" in f.title
    assert s1.counts["parameter comparisons"] == 3  # steps 1, 2 and 4


def test_sharded_parameters_and_a_zero_shard_are_not_compared():
    p = torch.nn.Parameter(torch.ones(2))
    assert not divergence.sharded(p)
    p._fsdp_flattened = True
    assert divergence.sharded(p)


# ------------------------------------------------------------------------------------------ loaders
def _data(n: int = 20) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32))


def test_which_loaders_are_described_and_how():
    data = _data()
    assert loaders.describe(DataLoader(data, batch_size=4, shuffle=True)) == {
        "sampler": "RandomSampler", "dataset": ["TensorDataset", 20], "samples": 20}
    assert loaders.describe(DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=0))) is None

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    assert loaders.describe(DataLoader(Stream())) is None
    first, second = Subset(data, range(0, 20, 2)), Subset(data, range(1, 20, 2))
    assert loaders.describe(DataLoader(first)) != loaders.describe(DataLoader(second))  # a shard per rank


def test_every_rank_iterating_the_same_samples_is_found_and_a_rank_0_only_loader_is_not(ranks):
    s0, s1 = ranks(2)
    checks = [loaders.Loaders(s0), loaders.Loaders(s1)]
    where = Where("/w/train.py", 7)
    ident = loaders.describe(DataLoader(_data(), batch_size=4, shuffle=True))
    checks[0]._meet("train.py:7#0", ident, where)
    checks[0]._meet("train.py:9#0", ident, Where("/w/train.py", 9))  # validation on rank 0 alone
    checks[1]._meet("train.py:7#0", ident, where)
    (f,) = found(s1)
    assert f.kind == "loader_not_distributed" and f.where.line == 7
    assert "every rank iterates all 20 samples" in f.title and "DistributedSampler(dataset)" in f.fix
    shard = [loaders.describe(DataLoader(Subset(_data(), range(r, 20, 2)))) for r in (0, 1)]
    checks[0]._meet("train.py:8#0", shard[0], None)
    checks[1]._meet("train.py:8#0", shard[1], None)
    assert len(found(s1)) == 1 and found(s0) == []


# ------------------------------------------------------------------------------------------ samplers
def _pass(check: samplers.Samplers, sampler: DistributedSampler, full: bool = True) -> list[int]:
    """One pass of ``sampler`` as the patched ``__iter__`` hands it out: to its end, or only its first index (a
    peek, as ``next(iter(loader))`` takes)."""
    check.iterating(sampler)
    indices = check.passing(sampler, iter(list(DistributedSampler.__iter__(sampler))))
    return list(indices) if full else [next(indices)]


def test_a_sampler_iterated_twice_for_the_same_epoch_is_found_once(ranks):
    (s, _) = ranks(2)
    check = samplers.Samplers(s)
    sampler = DistributedSampler(_data(), num_replicas=2, rank=0)
    passes = [_pass(check, sampler) for _ in range(3)]
    assert passes[0] == passes[1] == passes[2] and len(passes[0]) == 10  # the indices go through untouched
    (f,) = found(s)
    assert f.kind == "set_epoch_missing" and "never called: epoch 2 is shuffled exactly like epoch 1" in f.title
    assert "sampler.set_epoch(epoch)" in f.fix and f.where is not None


def test_set_epoch_every_epoch_or_no_shuffle_is_no_finding_and_the_same_value_is(ranks):
    (s, _) = ranks(2)
    check = samplers.Samplers(s)
    right = DistributedSampler(_data(), num_replicas=2, rank=0)
    ordered = DistributedSampler(_data(), num_replicas=2, rank=0, shuffle=False)
    for epoch in range(3):
        right.set_epoch(epoch)
        _pass(check, right)
        _pass(check, ordered)
    assert found(s) == []
    same = DistributedSampler(_data(), num_replicas=2, rank=0)
    check._states[same] = samplers._State(libraries.Call(None), set_epoch_calls=1)
    same.set_epoch(4)
    _pass(check, same)
    _pass(check, same)
    assert "called with the same value (4)" in found(s)[0].title


def test_a_peek_at_the_loader_before_set_epoch_is_no_epoch(ranks):
    """The PyTorch DDP tutorial's trainer: ``len(next(iter(loader))[0])``, then ``set_epoch(epoch)``, then the pass.
    The peek shuffles for the previous epoch and is left after one batch: no epoch, no finding."""
    (s, _) = ranks(2)
    check = samplers.Samplers(s)
    sampler = DistributedSampler(_data(), num_replicas=2, rank=0)
    for epoch in range(3):
        _pass(check, sampler, full=False)
        sampler.set_epoch(epoch)
        _pass(check, sampler)
    assert found(s) == []
    for _ in range(3):  # peeks alone, never a full pass: nothing to judge
        _pass(check, sampler, full=False)
    assert found(s) == []
    _pass(check, sampler)  # the 4th full pass, shuffled like the 3rd (epoch 2): found
    (f,) = found(s)
    assert "epoch 4 is shuffled exactly like epoch 3" in f.title and f.details == {"epoch": 2, "full_passes": 4}


def test_padding_skews_evaluation_and_not_training(ranks):
    (s, _) = ranks(2)
    check = samplers.Samplers(s)
    val = _data(101)
    assert samplers.padding(DistributedSampler(val, num_replicas=2, rank=0)) == 1
    assert samplers.padding(DistributedSampler(val, num_replicas=2, rank=0, drop_last=True)) == 0
    assert samplers.padding(DistributedSampler(_data(100), num_replicas=2, rank=0)) == 0
    train = DistributedSampler(val, num_replicas=2, rank=1)
    check.iterating(train)  # shuffled, with gradients: training, padding harmless
    assert found(s) == []
    with torch.no_grad():
        check.iterating(DistributedSampler(val, num_replicas=2, rank=1))
    check.iterating(DistributedSampler(val, num_replicas=2, rank=1, shuffle=False))
    f = found(s)[0]
    assert f.kind == "padded_evaluation" and "over 101 samples on 2 ranks" in f.title and "1 counted twice" in f.title
    assert f.details == {"samples": 101, "world_size": 2, "padded": 1, "total": 102, "shuffle": True}
    assert "Subset(val_set, range(rank, len(val_set), world_size))" in f.fix


# ------------------------------------------------------------------------------------------ saves
def test_two_ranks_saving_one_path_is_found_and_a_path_per_rank_is_not(ranks, tmp_path):
    s0, s1 = ranks(2)
    checks = [saves.Saves(s0), saves.Saves(s1)]
    assert saves.saved_path(str(tmp_path / "m.pt")) == str(tmp_path / "m.pt")
    assert saves.saved_path(__import__("io").BytesIO()) is None
    for rank, check in enumerate(checks):
        check._meet(str(tmp_path / f"ckpt-rank{rank}.pt"), None)
    assert found(s0) == found(s1) == []
    where = Where(str(tmp_path / "train.py"), 30)
    checks[0]._meet(str(tmp_path / "model.pt"), where)
    checks[1]._meet(str(tmp_path / "model.pt"), where)
    (f,) = found(s1)
    assert f.kind == "same_save_path" and f.title == f"ranks 0, 1 all write {tmp_path / 'model.pt'} with torch.save"
    assert "if dist.get_rank() == 0:" in f.fix


def test_of_three_ranks_writing_one_path_the_second_says_so_once(ranks, tmp_path):
    sessions = ranks(3)
    for s in sessions:
        saves.Saves(s)._meet(str(tmp_path / "model.pt"), None)
    assert [len(found(s)) for s in sessions] == [0, 1, 0]
    assert found(sessions[1])[0].title.startswith("ranks 0, 1 (so far, of 3) all write")


# ------------------------------------------------------------------------------------------ DDP's unused parameters
class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head, self.spare = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)

    def forward(self, x, spare: bool = False):
        return (self.spare if spare else self.head)(self.body(x))


group_of_one = test_ema.group_of_one  # the fixture: a gloo group of one process, for a real DDP model


def test_ddp_parameters_without_a_gradient_are_named_before_ddp_fails(ranks, group_of_one):
    (s,) = ranks(1)
    check = unused.Unused(s)
    ddp = torch.nn.parallel.DistributedDataParallel(TwoHeads())
    check.built(ddp)
    ddp(torch.ones(2, 4)).sum().backward()
    (f,) = found(s)
    assert f.kind == "ddp_unused_parameters" and f.details == {"parameters": ["spare.weight", "spare.bias"], "pass": 1}
    assert "find_unused_parameters=True" in f.fix and "Expected to have finished reduction" in f.cost
    assert s.ddp_params == {id(p) for p in ddp.module.parameters()}


def test_find_unused_parameters_with_nothing_unused_is_found_and_with_something_unused_is_not(ranks, group_of_one):
    (s,) = ranks(1)
    check = unused.Unused(s)
    needless = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1), find_unused_parameters=True)
    needed = torch.nn.parallel.DistributedDataParallel(TwoHeads(), find_unused_parameters=True)
    check.built(needless)
    check.built(needed)
    for step in range(3):
        needless(torch.ones(2, 4)).sum().backward()
        needed(torch.ones(2, 4), spare=step == 1).sum().backward()
    with needless.no_sync():
        needless(torch.ones(2, 4)).sum().backward()  # not judged: DDP reduces nothing here
    check.finish(clean=True)
    (f,) = found(s)
    assert f.kind == "find_unused_unneeded" and "in all 3 backward passes" in f.title
    assert all(not w.handles for w in check._watches)  # the hooks are gone


# ------------------------------------------------------------------------------------------ devices
def test_which_placements_are_someone_elses_gpu():
    assert devices.on_someone_elses_gpu(0, local_rank=1, local_world_size=2, device_count=2)
    assert not devices.on_someone_elses_gpu(1, local_rank=1, local_world_size=2, device_count=2)
    assert not devices.on_someone_elses_gpu(0, local_rank=0, local_world_size=2, device_count=2)
    assert not devices.on_someone_elses_gpu(0, local_rank=1, local_world_size=2, device_count=1)  # one GPU each
    assert not devices.on_someone_elses_gpu(None, local_rank=1, local_world_size=2, device_count=2)
    assert devices.nccl_backend("nccl", False) and devices.nccl_backend("cpu:gloo,cuda:nccl", False)
    assert devices.nccl_backend(None, True) and not devices.nccl_backend(None, False)
    assert not devices.nccl_backend("gloo", True)


def test_nccl_before_set_device_is_found_in_a_rank_that_is_not_local_rank_0(ranks, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    s0, s1 = ranks(2)
    devices.Devices(s0).before_init("nccl", {})
    right = devices.Devices(s1)
    right.device_set = 1
    right.before_init("nccl", {})
    devices.Devices(s1).before_init("nccl", {"device_id": torch.device("cuda", 1)})
    devices.Devices(s1).before_init("gloo", {})
    assert found(s0) == found(s1) == []
    devices.Devices(s1).before_init(None, {})
    (f,) = found(s1)
    assert f.kind == "no_set_device" and "its current device is cuda:0" in f.title
    assert "torch.cuda.set_device(local_rank)" in f.fix


def test_records_survive_json(ranks):
    (s, _) = ranks(2)
    s.report("device_cuda0", "t", "c", "f", Where("/x.py", 1), {"local_rank": 1})
    line = Path(s.path).read_text().splitlines()[0]
    assert json.loads(line)["record"] == "finding"


@pytest.mark.gpu
def test_a_gpu_fingerprint_is_copied_asynchronously_into_pinned_memory_and_read_when_ready():
    import copy

    torch.manual_seed(0)
    a = torch.nn.Linear(64, 64).cuda()
    b = copy.deepcopy(a)
    pending, host = divergence.fingerprint(list(a.parameters()))
    assert pending.event is not None and host is not None and host.is_pinned()
    values = pending.result()
    again, reused = divergence.fingerprint(list(b.parameters()), host)
    assert reused is host and again.result() == values  # equal parameters, equal fingerprints
    on_cpu = divergence.fingerprint([p.detach().cpu() for p in a.parameters()])[0].result()
    assert torch.allclose(torch.tensor(values), torch.tensor(on_cpu), rtol=1e-4)
