"""The post-mortem of users' own scripts: the legacy --local_rank failures, nccl on CPU workers, and fixes said in a
script's terms (pure: log excerpts in ``fixtures/postmortem``, no processes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mgpucli.postmortem.context import tailor
from mgpucli.postmortem.lines import parse
from mgpucli.postmortem.matchers import explain, legacy_local_rank, nccl_without_gpus
from mgpucli.postmortem.reader import RunRecord

FIXTURES = Path(__file__).parent / "fixtures" / "postmortem"


def lines(name: str, rank: int | None = None):
    path = FIXTURES / name
    return parse(path.read_text(), rank=rank, source=str(path))


def script_run(argv: list[str], kind: str = "cpu") -> RunRecord:
    launch = {"job": "script", "argv": argv, "devices": {"kind": kind}, "script": {"path": "main.py"}}
    return RunRecord(run_dir="/r", launch_paths=["/r/launch.json"], launch=launch, attempts=[], exitcodes={})


LAUNCH = ["mgpu", "launch", "--cpu", "--nproc", "2", "main.py", "--epochs", "3"]


def test_a_required_local_rank_names_the_option_and_the_command():
    match = legacy_local_rank(lines("legacy_local_rank_required.log"))
    assert match.signature == "legacy_local_rank" and match.rank == 0 and match.details["kind"] == "missing"
    assert match.details["flag"] == "--local_rank" and match.details["ranks"] == [0, 1]
    assert "--local-rank-arg" in match.fix and "--local_rank=N" in match.fix
    tailor(match, script_run(LAUNCH))
    assert match.fix.endswith("Run: mgpu launch --local-rank-arg --cpu --nproc 2 main.py --epochs 3")


def test_the_other_spelling_says_which_one_the_script_wants():
    match = legacy_local_rank(lines("legacy_local_rank_unrecognized.log", rank=0))
    assert match.details == {"kind": "unrecognized", "given": "--local-rank", "wants": "--local_rank", "ranks": [0]}
    assert match.title == "the script declares --local_rank, but was given --local-rank"
    assert "--local-rank-arg passes the spelling the script declares (--local_rank=N)" in match.fix


def test_a_script_that_takes_no_local_rank_is_told_to_drop_the_option():
    log = "usage: main.py [-h] [--epochs EPOCHS]\nmain.py: error: unrecognized arguments: --local-rank=1\n"
    match = legacy_local_rank(parse(log, rank=1))
    assert match.details["wants"] is None and "without --local-rank-arg" in match.fix
    tailor(match, script_run(["mgpu", "launch", "--local-rank-arg", "--cpu", "main.py"]))
    assert match.fix.endswith("Run: mgpu launch --cpu main.py")


@pytest.mark.parametrize("log", [
    "legacy_local_rank_default.log",
    'Traceback (most recent call last):\n  File "main.py", line 9, in <module>\n'
    '    device = torch.device("cuda", args.local_rank)\nRuntimeError: Device index must not be negative\n',
])
def test_a_local_rank_left_at_its_default_is_recognised(log: str):
    found = lines(log, rank=0) if log.endswith(".log") else parse(log, rank=0)
    match = explain(found)
    assert match.signature == "legacy_local_rank" and match.details["kind"] == "default", match
    assert "--local-rank-arg" in match.fix and "LOCAL_RANK" in match.fix


def test_an_ordinary_exception_mentioning_local_rank_elsewhere_is_not_it():
    log = ('Traceback (most recent call last):\n  File "main.py", line 9, in <module>\n'
           "    print(args.local_rank, batch[3])\nIndexError: list index out of range\n")
    assert explain(parse(log, rank=0)).signature == "python_exception"


def test_nccl_on_cpu_workers_says_gloo_and_why():
    match = nccl_without_gpus(lines("nccl_without_gpus.log"))
    assert match.signature == "nccl_without_gpus" and match.rank == 1 and "gloo" in match.fix
    assert explain(lines("nccl_without_gpus.log")).signature == "nccl_without_gpus"  # before the exception
    tailor(match, script_run(LAUNCH))
    assert match.fix.startswith("This launch ran CPU workers (--cpu)")


_RECIPE_WORDS = re.compile(r"\btrainer\.|\bdata\.|\boptim\.|--resume|\brun_dir\b|mgpu train|recipe")


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_every_fix_is_said_in_a_scripts_terms(fixture: str):
    match = explain(lines(fixture, rank=0))
    if match is None:
        pytest.skip("no signature in this excerpt")
    tailor(match, script_run(LAUNCH))
    assert not _RECIPE_WORDS.search(match.fix), match.fix
    assert match.fix.strip() and "  " not in match.fix and " ." not in match.fix, match.fix


def test_a_timeout_note_names_each_ranks_step_and_the_late_ones(monkeypatch):
    from mgpucli.distributed import step_progress
    from mgpucli.postmortem.matchers import collective_timeout
    from tests.unit.test_launch_script import FakeBeat

    monkeypatch.setattr(step_progress, "_heartbeat", FakeBeat({0: 7, 1: 4, 2: 7}))
    error = "RuntimeError: Timed out waiting 3000ms for recv operation to complete"
    note = step_progress.timeout_note(RuntimeError(error))
    match = collective_timeout(parse(f"{error}\n{note}\n", rank=0))
    assert match.details["rank_steps"] == {"0": 7, "1": 4, "2": 7} and match.details["late_ranks"] == [1]
    assert match.step == 7 and match.evidence[1].text == note


def test_an_abort_at_teardown_suggests_a_barrier_before_destroy():
    log = ("[rank0]:terminate called without an active exception\n[rank0]:Fatal Python error: Aborted\n"
           "[rank0]:\n[rank0]:Thread 0x00007f29e95c3b80 (most recent call first):\n[rank0]:  <no Python frame>\n")
    match = explain(parse(log))
    assert match.signature == "killed_by_signal" and match.details["signal"] == "SIGABRT"
    assert match.evidence[0].text == "terminate called without an active exception"
    assert "dist.barrier() before dist.destroy_process_group()" in match.fix


@pytest.mark.parametrize("said", [
    "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",  # a CPU build of torch
    "RuntimeError: No CUDA GPUs are available",
    "AssertionError: Torch not compiled with CUDA enabled",
])
def test_cuda_on_cpu_workers_is_named_and_under_cpu_explained(said: str):
    log = ('Traceback (most recent call last):\n  File "main.py", line 4, in <module>\n'
           f"    torch.cuda.set_device(local_rank)\n{said}\n")
    match = explain(parse(log, rank=0))
    assert match.signature == "cuda_without_gpus" and "torch.cuda.is_available()" in match.fix
    tailor(match, script_run(LAUNCH))
    assert match.fix.startswith("This launch ran CPU workers (--cpu)")
    gpu_match = explain(parse(log, rank=0))
    tailor(gpu_match, script_run(LAUNCH, kind="cuda"))
    assert "--cpu" not in gpu_match.fix


UNUSED_UNDER_THE_TRAINER = """Traceback (most recent call last):
  File "/w/train.py", line 90, in <module>
    trainer.train()
  File "/venv/lib/python3.11/site-packages/transformers/trainer.py", line 1576, in train
    return inner_training_loop(
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1886, in forward
    inputs, kwargs = self._pre_forward(*inputs, **kwargs)
RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.
"""


@pytest.mark.parametrize("where, fix", [
    ("traceback", "args = TrainingArguments(..., ddp_find_unused_parameters=True)"),
    ("audit", "DistributedDataParallelKwargs(find_unused_parameters=True)"),
    ("nowhere", None),
])
def test_a_failure_in_what_a_library_set_up_gets_the_librarys_fix(where: str, fix: str | None):
    """The library: the outermost one on the failing rank's traceback, or the one --audit found behind the DDP
    model; none found, the script's terms (a raw DDP(...))."""
    log = UNUSED_UNDER_THE_TRAINER if where == "traceback" else UNUSED_UNDER_THE_TRAINER.replace("transformers", "x")
    found = parse(log, rank=1)
    match = explain(found)
    run = script_run(LAUNCH)
    if where == "audit":
        run.audit = {"findings": [{"kind": "ddp_unused_parameters", "details": {"library": "accelerate"}}]}
    tailor(match, run, found)
    if fix is None:
        assert "DDP(..., find_unused_parameters=True)" in match.fix and "library" not in match.details
    else:
        assert "built this job's DDP model, so the fix goes through it:\n" in match.fix and fix in match.fix
        assert "DDP(..., find_unused_parameters=True)" not in match.fix, match.fix
