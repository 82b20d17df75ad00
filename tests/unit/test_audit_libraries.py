"""``mgpu launch --audit`` on scripts built on a training library: which library's code made a call, where the user
created the object holding its setting, the fix in its terms (:mod:`mgpucli.audit.libraries`), and the checks that
use them. The libraries' code is played by small classes compiled under a ``site-packages/<package>/`` file name (what
the audit goes by); the e2e tests (tests/e2e/test_library_scripts.py) run the real ones."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from mgpucli import torch_import
from mgpucli.audit import divergence, libraries, loaders, samplers
from mgpucli.training_libraries import ACCELERATE, FABRIC, LIBRARIES, TRAINER
from tests.unit.test_audit_checks import found

SITE = "/venv/lib/python3.11/site-packages"


def library_code(package_file: str, source: str) -> dict:
    """``source`` run as if it were the installed file ``site-packages/<package_file>``: its namespace."""
    space: dict = {"__name__": package_file}
    exec(compile(source, f"{SITE}/{package_file}", "exec"), space)
    return space


ACCELERATE_CODE = """
class Accelerator:
    def __init__(self, ddp_handler=None):
        self.ddp_handler = ddp_handler

    def prepare(self, check):
        return check()
"""

TRAINER_CODE = """
class TrainingArguments:
    def __init__(self, ddp_find_unused_parameters=None):
        self.ddp_find_unused_parameters = ddp_find_unused_parameters

class Trainer:
    def __init__(self, args, accelerator):
        self.args, self.accelerator = args, accelerator

    def train(self, check):
        return self.accelerator.prepare(check)
"""


@pytest.fixture
def fake_libraries():
    """Accelerate's and Transformers' classes as library code, their constructors watched as the audit watches the
    real ones."""
    accelerate = library_code("accelerate/accelerator.py", ACCELERATE_CODE)
    transformers = library_code("transformers/trainer.py", TRAINER_CODE)
    libraries._watch(accelerate["Accelerator"], "__init__")
    libraries._watch(transformers["TrainingArguments"], "__init__")
    return accelerate, transformers


def test_the_outermost_library_under_the_users_line_is_the_one_and_its_setting_is_where_the_user_made_it(
        fake_libraries):
    accelerate, transformers = fake_libraries
    args = transformers["TrainingArguments"]()
    args_line = sys._getframe().f_lineno - 1
    trainer = transformers["Trainer"](args, accelerate["Accelerator"]())
    call = trainer.train(functools.partial(libraries.here, setting=True))
    train_line = sys._getframe().f_lineno - 1
    assert call.library is TRAINER  # the Trainer, not the Accelerate it calls
    assert (call.setting.file, call.setting.line) == (__file__, args_line)  # the user's TrainingArguments(...)
    assert (call.where.file, call.where.line) == (__file__, train_line)  # the user's trainer.train(...)
    assert call.place("find_unused_unneeded", call.where) is call.setting  # a fix made there
    assert call.place("same_save_path", call.where) is call.where  # one made elsewhere


def test_accelerates_setting_is_its_handler_when_given_else_the_accelerator(fake_libraries):
    accelerate, _ = fake_libraries
    plain = accelerate["Accelerator"]()
    plain_line = sys._getframe().f_lineno - 1
    call = plain.prepare(functools.partial(libraries.here, setting=True))
    assert call.library is ACCELERATE and call.setting.line == plain_line
    handler = accelerate["Accelerator"]()  # stands for DistributedDataParallelKwargs(...): watched, weakly referable
    handler_line = sys._getframe().f_lineno - 1
    with_handler = accelerate["Accelerator"](ddp_handler=handler)
    assert with_handler.prepare(functools.partial(libraries.here, setting=True)).setting.line == handler_line


def test_without_a_library_on_the_stack_the_call_is_the_users_own_and_a_site_goes_with_its_object(fake_libraries):
    call = libraries.here(setting=True)
    assert call.library is None and call.setting is None and call.place("ddp_unused_parameters", None) is None
    assert call.where.file == __file__
    accelerate, _ = fake_libraries
    acc = accelerate["Accelerator"]()
    key = id(acc)
    assert libraries.site_of(acc) is not None
    del acc
    assert key not in libraries._sites  # forgotten with its object: an id used again names nothing stale


def test_a_fix_is_said_in_the_terms_of_the_library_on_the_stack_else_of_the_jobs_else_as_given():
    raw = ("model = DDP(model)", "costs.")
    assert libraries.in_terms("find_unused_unneeded", *raw, None) == raw
    fix, cost = libraries.in_terms("find_unused_unneeded", *raw, TRAINER)
    assert fix.startswith("args = TrainingArguments(..., ddp_find_unused_parameters=False)")
    assert cost.startswith("costs. The Trainer asks DDP for it")
    fix, cost = libraries.in_terms("padded_evaluation", *raw, None, FABRIC)  # the job's library: its fix,
    assert "use_distributed_sampler=False" in fix and cost == "costs."  # not what it did (it did not make this one)
    assert libraries.in_terms("set_epoch_missing", *raw, FABRIC, ACCELERATE) == raw  # no words
    fix, _ = libraries.in_terms("same_save_path", *raw, None, ACCELERATE)  # the user's torch.save
    assert fix.startswith("accelerator.save(state, path)")
    assert libraries.in_terms("find_unused_unneeded", *raw, None, TRAINER) == raw  # the library's own doing
    fix, _ = libraries.in_terms("loader_not_distributed", *raw, ACCELERATE)  # what it did: not join
    assert "Accelerator(cpu=True" in fix
    fix, _ = libraries.in_terms("loader_not_distributed", *raw, None, ACCELERATE)  # one the user kept
    assert "accelerator.prepare(model, optimizer, loader)" in fix


def test_every_library_has_a_fix_for_both_unused_parameter_findings_and_none_is_a_raw_ddp_line():
    for lib in LIBRARIES:
        assert {"find_unused_unneeded", "ddp_unused_parameters"} <= set(lib.fixes), lib.name
        assert all("DDP(" not in fix for fix in lib.fixes.values()), lib.name


def test_when_module_loads_runs_after_the_module_and_the_finder_goes_once_nothing_waits(tmp_path, monkeypatch):
    (tmp_path / "mgpu_probe_mod.py").write_text("class Args:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    torch_import.when_module_loads("mgpu_probe_mod", lambda module: seen.append(hasattr(module, "Args")))
    assert any(isinstance(f, torch_import._WhenLoaded) for f in sys.meta_path)
    import mgpu_probe_mod  # noqa: F401

    assert seen == [True]  # after its code ran, once
    assert not any(isinstance(f, torch_import._WhenLoaded) for f in sys.meta_path)
    torch_import.when_module_loads("mgpu_probe_mod", lambda module: seen.append("now"))  # loaded already: at once
    assert seen == [True, "now"]
    sys.modules.pop("mgpu_probe_mod")


# ---------------------------------------------------------------------------------------------- the checks
class OrdersItself(DistributedSampler):
    """Lightning's DistributedSamplerWrapper, in short: the order is the wrapped sampler's, shuffle=False."""

    def __iter__(self):
        return iter(list(super().__iter__()))


def test_a_sampler_that_picks_its_own_order_is_evaluation_only_under_no_grad(ranks):
    (s, _) = ranks(2)
    check = samplers.Samplers(s)
    odd = TensorDataset(torch.zeros(127, 1))
    wrapper = OrdersItself(odd, num_replicas=2, rank=0, shuffle=False)
    assert samplers.orders_itself(wrapper) and not samplers.orders_itself(DistributedSampler(odd, 2, 0))
    check.iterating(wrapper)  # in training: padding harmless
    assert found(s) == []
    with torch.no_grad():
        check.iterating(OrdersItself(odd, num_replicas=2, rank=0, shuffle=False))
    (f,) = found(s)
    assert f.kind == "padded_evaluation" and "(iterated under torch.no_grad())" in f.title


def test_a_loader_a_library_dispatches_is_not_judged_and_one_it_passes_through_is_in_its_terms(ranks):
    (s, _) = ranks(2)
    check = loaders.Loaders(s)
    queued = []
    s.later = lambda task, *args: queued.append(args)  # what would meet in the store
    iterate = ("class State:\n    num_processes = 2\n"
               "class {name}:\n    state = State()\n"
               "    def batches(self):\n        return self.check(self.loader)\n")
    for package_file, name in (("accelerate/data_loader.py", "DataLoaderDispatcher"),  # in a job: its own sharding
                               ("accelerate/data_loader.py", "DataLoaderShard"),  # all the samples: Accelerate alone
                               ("lightning_fabric/wrappers.py", "_FabricDataLoader")):  # use_distributed_sampler=False
        shard = library_code(package_file, iterate.format(name=name))[name]()
        shard.check, shard.loader = check.first_iter, DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2)
        shard.batches()  # the library's code iterating the loader: its first iter()
    assert s.counts["data loaders"] == 3
    assert [(library, ident["sampler"]) for _, ident, _, library in queued] == [
        (ACCELERATE, "SequentialSampler"), (FABRIC, "SequentialSampler")]


def test_parameters_that_part_after_ddp_left_some_without_a_gradient_are_a_note_not_a_finding(ranks):
    s0, s1 = ranks(2)
    params = [torch.nn.Parameter(torch.zeros(2))]
    tracked = divergence.Tracked(index=0, site=None, ref=None, param_ids={id(p) for p in params})
    for s in (s0, s1):
        s.ddp_params.update(tracked.param_ids)
    s1.unreduced.update(tracked.param_ids)
    divergence.Divergence(s1)._report_diverged(tracked, "at optimizer step 1", [[0], [1]], 1)
    assert found(s1) == [] and "DDP never reduced their bucket" in s1.notes[0]
    divergence.Divergence(s0)._report_diverged(tracked, "at optimizer step 1", [[0], [1]], 1)
    assert found(s0)[0].kind == "params_diverged"  # without that finding first: a rank skipped a step


def test_an_optimizer_a_library_steps_unwrapped_gets_the_librarys_fix(ranks):
    (s,) = ranks(1)
    tracked = divergence.Tracked(index=0, site=None, ref=None, call=libraries.Call(None, ACCELERATE))
    divergence.Divergence(s)._report_diverged(tracked, "at optimizer step 1", [[0], [1]], 1)
    (f,) = found(s)
    assert "not wrapped in DistributedDataParallel" in f.title and "accelerator.prepare(model" in f.fix
    assert "DDP(" not in f.fix
