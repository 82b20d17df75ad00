"""Elastic jobs (``--nnodes MIN:MAX``), the pure parts: the range and the global batch it keeps, the plan, the rounds'
gathering, the waiting lines and the stop below MIN, the membership line, the restart rule, the survivors' turns at
``last.pt``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from mgpucli import batch_layout, env_vars
from mgpucli.batch_layout import Layout, Segment
from mgpucli.errors import EXIT_FAILED, EXIT_PREEMPTED, UsageError
from mgpucli.launch import elastic_rounds, membership, restart
from mgpucli.launch.elastic_rounds import Gathering
from mgpucli.launch.job_source import read_scheduler
from mgpucli.launch.meeting import Meeting, NodesMissing, Watching
from mgpucli.launch.node_presence import Member, Seen, View
from mgpucli.launch.node_range import NodeRange, check_global_batch, parse_nnodes
from mgpucli.launch.plan import LaunchOptions, Machine, RecipeFacts, build_plan
from mgpucli.run_records.launch_record import Attempt, RankFiles
from mgpucli.run_records.worker_records import FailureRecord, mark_started, record_path, write_record


# ------------------------------------------------------------------------------------------ the range, the batch
def test_a_node_count_or_a_range_and_what_is_refused():
    assert parse_nnodes("2") == NodeRange(2, 2) and not parse_nnodes("2").elastic
    assert parse_nnodes("1:4") == NodeRange(1, 4) and str(parse_nnodes("1:4")) == "1:4"
    assert str(parse_nnodes("2:2")) == "2" and not parse_nnodes("2:2").elastic  # torchrun's fixed MIN:MAX
    for bad, said in (("3:2", "MAX is below MIN"), ("0:2", "at least 1"), ("a:b", "MIN:MAX (1:4)")):
        with pytest.raises(UsageError) as info:
            parse_nnodes(bad)
        assert said in str(info.value) and f"--nnodes {bad}" in str(info.value)
    job = read_scheduler({"PET_NNODES": "1:4", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:29400"})
    assert (job.nnodes_min, job.nnodes) == (1, 4)
    with pytest.raises(UsageError, match="PET_NNODES=4:1"):
        read_scheduler({"PET_NNODES": "4:1"})


def test_every_count_of_the_range_must_keep_the_global_batch_with_a_whole_grad_accum():
    check_global_batch(NodeRange(1, 2), 2, 32, 2 * 2 * 32, "the recipe's")  # 1 x 2 x 32 x grad_accum 2
    with pytest.raises(UsageError) as info:
        check_global_batch(NodeRange(2, 3), 1, 32, 96, "the recipe's on 3 nodes")
    err = info.value
    assert "cannot be kept with a whole trainer.grad_accum on 2 node(s) (96 / (2 x 1 x 32) = 1.5)" in err.message
    assert "Keep the global batch 96 with: data.batch_size=16 trainer.grad_accum=2" in err.hint
    assert "Or another global batch, 192: data.batch_size=32 trainer.grad_accum=2." in err.hint
    with pytest.raises(UsageError) as info:
        check_global_batch(NodeRange(1, 4), 1, 32, 128, "the recipe's")
    assert "on 3 node(s)" in info.value.message and "of 1 to 4 nodes, 1, 2, 4 keep it" in info.value.hint


def test_a_fresh_elastic_start_keeps_the_global_batch_at_max_nodes():
    assert batch_layout.elastic_global_batch({env_vars.ELASTIC_GLOBAL_BATCH: "64"}) == 64
    assert batch_layout.elastic_global_batch({}) is None
    kept = batch_layout.elastic_start(64, 1, 32, 1)
    assert kept.layout == Layout(1, 32, 2) and "keeping its global batch 64 on 1 process(es)" in kept.note
    assert batch_layout.elastic_start(64, 2, 32, 1).note is None
    with pytest.raises(UsageError):
        batch_layout.elastic_start(64, 3, 32, 1)


def test_segments_record_their_nodes_and_a_new_node_count_is_a_new_segment():
    two, one = Layout(2, 32, 1), Layout(1, 32, 2)
    segments = batch_layout.continued([Segment(1, two, 2)], 39, one, 1)
    segments = batch_layout.continued(segments, 51, two, 2)
    assert batch_layout.describe(segments, 64) == (
        "steps 1-39 on 2 nodes x 1 process(es) (global batch 64 = 2 x 32 x grad_accum 1), steps 40-51 on 1 node x 1 "
        "process(es) (global batch 64 = 1 x 32 x grad_accum 2), steps 52-64 on 2 nodes x 1 process(es) (global batch "
        "64 = 2 x 32 x grad_accum 1)")
    assert batch_layout.segments_of({"segments": [s.record() for s in segments]}) == segments
    assert batch_layout.continued([Segment(1, two, 2)], 5, two, 2) == [Segment(1, two, 2)]
    assert "nodes" not in Segment(1, two).record()  # one node: as before


# ------------------------------------------------------------------------------------------------- the plan
def plan(**opts):
    return build_plan(LaunchOptions(recipe="r.yaml", cpu=True, nproc=1, **opts), RecipeFacts(run_dir="runs/q"),
                      Machine(0, 4, "box", {}), port_check=lambda port: None, host_check=lambda host, wait: None)


def test_an_elastic_plan_is_torchruns_with_short_rounds_and_restarts_for_its_membership():
    found = plan(nnodes=2, nnodes_min=1, rdzv_endpoint="h:29400", max_restarts=2)
    args = found.torchrun_args
    assert args[args.index("--nnodes") + 1] == "1:2" and found.nodes == NodeRange(1, 2)
    conf = args[args.index("--rdzv-conf") + 1]
    assert conf == "join_timeout=600,last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=3"
    assert args[args.index("--max-restarts") + 1] == str(2 + elastic_rounds.NODE_CHANGES)
    assert found.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # every round its own store
    fixed = plan(nnodes=2, rdzv_endpoint="h:29400")
    assert "--max-restarts" not in fixed.torchrun_args and "last_call" not in " ".join(fixed.torchrun_args)


def test_an_elastic_range_with_a_static_rendezvous_is_refused_with_the_fix():
    with pytest.raises(UsageError) as info:
        plan(nnodes=2, nnodes_min=1, node_rank=0, master_addr="h", master_port=29500)
    assert "--nnodes 1:2 is an elastic job" in info.value.message and "--rdzv-endpoint HOST:PORT" in info.value.hint


# --------------------------------------------------------------------------------------- entering torch's round
A, B, C = Member("a", 1, 0), Member("b", 2, 1), Member("c", 3, 2)


def view(*seen: tuple[Member, bool, int, bool]) -> View:
    """Each launcher as (who, waiting now, rounds it met, its record still renewed)."""
    return View(True, tuple(Seen(member, waiting, 0, fresh, met) for member, waiting, met, fresh in seen))


def test_at_the_start_a_node_waits_for_max_or_for_min_and_the_grace():
    gathering = Gathering(1, 2, A, [], grace_s=30)
    assert not gathering.ready(view((A, True, 0, True)), 0.0)
    assert not gathering.ready(view((A, True, 0, True)), 29.0)
    assert gathering.ready(view((A, True, 0, True)), 30.0)  # MIN here for the grace: the job starts
    assert Gathering(1, 2, A, []).ready(view((A, True, 0, True), (B, True, 0, True)), 0.0)  # MAX: at once


def test_a_node_that_finds_the_job_running_enters_at_once():
    assert Gathering(1, 2, B, []).ready(view((A, False, 1, True), (B, True, 0, True)), 0.0)
    assert not Gathering(2, 3, B, []).ready(view((A, False, 1, False), (B, True, 0, True)), 0.0)  # its launcher gone


def test_after_a_restart_a_node_waits_for_every_survivor_of_its_round():
    gathering = Gathering(1, 3, A, [A, B, C], grace_s=30)
    survivors = view((A, True, 1, True), (B, False, 1, True), (C, False, 1, False))  # B writes its checkpoint
    assert not gathering.ready(survivors, 0.0)
    assert gathering.ready(view((A, True, 1, True), (B, True, 1, True), (C, False, 1, False)), 1.0)
    assert gathering.ready(survivors, 31.0)  # B never comes back to wait: not longer than the grace
    unseen = Gathering(1, 2, A, [A, B])
    assert not unseen.ready(View(False, ()), 0.0)  # this node's presence not connected yet
    assert unseen.ready(View(False, ()), elastic_rounds.UNSEEN_S)  # no store: torch's round says what became of it


# --------------------------------------------------------------------------------------- the waiting lines
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def elastic_meeting(view_: View, entry: int, met=(), checkpoint=None, low: int = 1, high: int = 2):
    said: list[str] = []
    watching = Watching(backend="c10d", endpoint="10.0.0.1:29400", run_id="mgpu-x", nnodes=high, node_rank=0,
                        join_timeout=600, min_nodes=low, last_step=lambda: 40, checkpoint_step=lambda: checkpoint,
                        say=said.append)
    clock = Clock()
    return Meeting(watching, A, entry, list(met), lambda: view_, clock=clock), clock, said


def test_an_elastic_jobs_wait_says_the_range_and_goes_on_without_a_lost_node():
    wait, _, _ = elastic_meeting(View(True, (Seen(A, True, 1, True), Seen(B, False, 0, False))), 1, met=[A, B])
    assert wait.again_line().startswith("mgpu launch: the workers stopped; waiting for the nodes (at least 1) to meet")
    assert wait.line() == ("node 1 (b) lost at step 40; the job goes on without it once the nodes here meet at "
                           "10.0.0.1:29400: 1 here (node 0 (a); the job takes 1 to 2); 10m00s left (--join-timeout "
                           "600).")


def test_below_min_at_the_join_timeout_an_elastic_job_stops_with_its_checkpoint_exit_75():
    lost_view = View(True, (Seen(A, True, 1, True), Seen(B, False, 0, False)))
    wait, clock, _ = elastic_meeting(lost_view, 1, met=[A, B], checkpoint=39, low=2, high=3)
    clock.now += 600
    with pytest.raises(NodesMissing) as info:
        wait.tick()
    err = info.value
    assert err.exit_code == EXIT_PREEMPTED and err.status == "node_lost"
    assert err.message == ("node 1 (b) lost at step 40; the job needs at least 2 nodes (--nnodes 2:3) and 1 met again "
                           "at 10.0.0.1:29400 within --join-timeout 600 s (node 0 (a)), so it stops; its checkpoint at "
                           "step 39 is complete. Exit code 75 (requeue).")
    assert "--resume auto" in err.hint and err.details["checkpoint_step"] == 39
    from mgpucli.postmortem.meeting import _unmet_title

    assert _unmet_title(err.details, " at 10.0.0.1:29400") == (
        "node 1 (b) lost; fewer than the 2 nodes the elastic job needs met again at 10.0.0.1:29400 within "
        "--join-timeout 600 s; it stopped with its checkpoint at step 39 (exit 75: requeue it)")
    wait, clock, _ = elastic_meeting(lost_view, 1, met=[A, B], checkpoint=None, low=2, high=3)
    clock.now += 600
    with pytest.raises(NodesMissing) as info:
        wait.tick()
    assert info.value.exit_code == EXIT_FAILED


# --------------------------------------------------------------------------------------- the membership line
def _attempt(tmp_path: Path, number: int) -> Attempt:
    error_file = tmp_path / f"attempt_{number}" / "0" / "error.json"
    error_file.parent.mkdir(parents=True)
    return Attempt(number, str(error_file.parent.parent), {0: RankFiles(0, 0, "", "", str(error_file))})


def test_the_line_after_a_lost_node_names_the_step_the_layout_and_the_cost(tmp_path: Path):
    before, now = _attempt(tmp_path, 0), _attempt(tmp_path, 1)
    mark_started({"step": 20, "world_size": 2, "batch_size": 32, "grad_accum": 1, "nodes": 2, "strategy": "ddp"},
                 {env_vars.ERROR_FILE: before.ranks[0].error_file})
    failed = FailureRecord(rank=0, local_rank=0, attempt=0, time=time.time() - 14, type="JobFailed",
                           message="rank 0: lost its connection", step=40, exit_code=1)
    write_record(record_path(before.ranks[0].error_file), failed)
    assert membership.measure(before, now, ["node 1"], [], 1, 1) is None  # not training yet
    mark_started({"step": 39, "world_size": 1, "batch_size": 32, "grad_accum": 2, "nodes": 1, "strategy": "single"},
                 {env_vars.ERROR_FILE: now.ranks[0].error_file})
    change = membership.measure(before, now, ["node 1"], [], 1, 1)
    assert (change["completed"], change["resumed_after"], change["steps_lost"]) == (39, 39, 0)
    assert 13 < change["seconds_without_training"] < 60
    line = membership.describe(change)
    assert line.startswith("node 1 lost at step 40; continuing on 1 node x 1 process(es) after step 39, the last step "
                           "every rank completed: global batch 64 = 1 x 32 x grad_accum 2; 0 steps lost, ")
    fsdp = membership.describe({**change, "resumed_after": 30, "steps_lost": 9, "strategy": "fsdp"})
    assert ("from its latest checkpoint, after step 30; under FSDP the lost node's shards of the steps since went "
            "with it") in fsdp and "9 steps lost" in fsdp
    joined = membership.describe({**change, "lost": [], "joined": ["node 1"], "in_step": None, "completed": 51,
                                  "resumed_after": 51, "nodes": 2})
    assert joined.startswith("node 1 joined; continuing on 2 nodes x 1 process(es) after step 51, the last step")


# --------------------------------------------------------------------------------------- the workers' restart rule
def test_a_node_that_joins_a_running_job_resumes_it_like_a_restart():
    joining = {env_vars.RESTART_COUNT: "0", env_vars.CONTINUES: "1"}
    assert restart.continues(joining) and restart.resume_arg_for_restart(None, environ=joining) == "auto"
    assert not restart.overwrite_for_restart(True, joining)
    first = {env_vars.RESTART_COUNT: "0", env_vars.CONTINUES: "0"}
    assert not restart.continues(first) and restart.resume_arg_for_restart(None, environ=first) is None
    assert restart.continues({env_vars.RESTART_COUNT: "2"})  # plain torchrun: its count says it


# --------------------------------------------------------------------------------------- the survivors' turns
def test_survivors_take_turns_and_last_pt_ends_at_the_newest_step(tmp_path: Path, monkeypatch):
    from mgpucli.engine.checkpoints import rescue
    from mgpucli.engine.checkpoints.files import FORMAT_VERSION

    path = tmp_path / "checkpoints" / "last.pt"
    written: list[int] = []

    def payload(step: int) -> dict:
        return {"mgpu_format": FORMAT_VERSION, "step": step, "epoch": 0, "model": {}, "optimizer": {}}

    real = rescue.save_atomic
    monkeypatch.setattr(rescue, "save_atomic", lambda p, target, step: (written.append(step), real(p, target, step)))
    threads = [threading.Thread(target=rescue.write_if_newer, args=(payload(s), path, s)) for s in (39, 40, 39)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info

    assert read_checkpoint_info(str(path)).step == 40
    assert written.count(40) == 1 and written.count(39) <= 1  # never the same step twice, never an older one last
    assert not rescue.write_if_newer(payload(40), path, 40)
    assert json.dumps(sorted(p.name for p in path.parent.iterdir())) == json.dumps([rescue.LOCK_NAME, "last.pt"])
