"""Experiment trackers without a tracker: the recipe keys and checks, the mode and store rules, the tracking thread
with stand-in sinks (failures, resume, a hung tracker), and what mgpu doctor shows. The real W&B and MLflow runs
are in tests/e2e/test_trackers.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mgpucli import trackers
from mgpucli.config import check_recipe, load_recipe
from mgpucli.config.tracker_check import tracker_problems
from mgpucli.doctor import checks_software as sw
from mgpucli.doctor.gather import observe_trackers
from mgpucli.doctor.observation import Observation, TrackerInfo
from mgpucli.engine import tracking as tracking_mod
from mgpucli.engine.rundir import MetricsWriter
from mgpucli.engine.tracking import Started, Tracking, backlog, metrics_of
from mgpucli.errors import RecipeError
from mgpucli.postmortem.render import tracker_lines
from tests.procs import RECIPES

QUICK = str(RECIPES / "quickstart.yaml")


def no_credentials(tmp_path: Path, **env: str) -> dict[str, str]:
    return {"NETRC": str(tmp_path / "no-netrc"), **env}


# ------------------------------------------------------------------------------------------------ recipe keys
def test_loggers_default_to_tensorboard_and_tensorboard_true_or_false_wins():
    cfg = load_recipe(QUICK)
    assert list(cfg.trainer.loggers) == ["tensorboard"] and cfg.trainer.tensorboard is None
    assert cfg.trainer.wandb.mode == "auto" and cfg.trainer.mlflow.tracking_uri is None
    assert trackers.enabled(["tensorboard"], None) == ["tensorboard"]
    assert trackers.enabled(["tensorboard"], False) == []  # trainer.tensorboard=false keeps working
    assert trackers.enabled(["wandb"], None) == ["wandb"]
    assert trackers.enabled(["wandb", "wandb"], True) == ["tensorboard", "wandb"]
    assert trackers.trackers_in(["tensorboard", "mlflow", "wandb"]) == ["mlflow", "wandb"]


def test_unknown_loggers_modes_and_a_string_for_the_list_are_recipe_problems():
    with pytest.raises(RecipeError) as err:
        load_recipe(QUICK, ["trainer.loggers=[wandbb,jsonl]", "trainer.wandb.mode=on"])
    text = str(err.value)
    assert "trainer.loggers: 'wandbb' is not a logger mgpu knows (did you mean 'wandb'?" in text
    assert "trainer.loggers: 'jsonl' need not be listed: metrics.jsonl is always written" in text
    assert "trainer.wandb.mode: 'on' is not one of auto, online, offline" in text
    with pytest.raises(RecipeError, match=r"expected a list, e.g. 'trainer.loggers=\[wandb\]'"):
        load_recipe(QUICK, ["trainer.loggers=wandb"])


def test_a_tracker_not_installed_names_the_key_and_the_pip_command(monkeypatch, tmp_path):
    cfg = load_recipe(QUICK, ["trainer.loggers=[tensorboard,wandb,mlflow]", f"run_dir={tmp_path / 'run'}"])
    missing = {"wandb", "sqlalchemy"}
    monkeypatch.setattr(trackers, "module_problem",
                        lambda module, importing: f"{module} is not installed" if module in missing else None)
    problems = tracker_problems(cfg, importing=False, environ={})
    assert problems[0] == ("trainer.loggers: wandb: wandb is not installed; install it with pip install 'mgpu[wandb]', "
                           "or drop wandb from trainer.loggers")
    assert "mlflow: its store sqlite:///" in problems[1] and "needs sqlalchemy" in problems[1]
    assert "pip install 'mgpu[mlflow]'" in problems[1]
    with pytest.raises(RecipeError) as err:
        check_recipe(cfg, QUICK)
    assert err.value.exit_code == 2 and len(err.value.problems) == 2
    # a server needs no SQL modules; a checkpoint's recipe being validated trains nothing, so nothing is checked
    served = load_recipe(QUICK, ["trainer.loggers=[mlflow]", "trainer.mlflow.tracking_uri=http://mlflow:5000"])
    assert tracker_problems(served, importing=False, environ={}) == []
    check_recipe(cfg, QUICK, trackers=None)


def test_module_problem_looks_up_or_imports():
    assert trackers.module_problem("json", importing=True) is None
    assert trackers.module_problem("json", importing=False) is None
    assert trackers.module_problem("no_such_tracker_xyz", importing=False) == "no_such_tracker_xyz is not installed"
    assert trackers.module_problem("no_such_tracker_xyz", importing=True) == "no_such_tracker_xyz is not installed"


# ----------------------------------------------------------------------------------------- modes and stores
def test_wandb_mode_offline_without_credentials_online_with_them(tmp_path):
    assert trackers.wandb_mode("auto", no_credentials(tmp_path)).mode == "offline"
    assert trackers.wandb_mode("auto", no_credentials(tmp_path, WANDB_API_KEY="k")).mode == "online"
    assert trackers.wandb_mode("auto", no_credentials(tmp_path, WANDB_API_KEY="k", WANDB_MODE="offline")).mode \
        == "offline"
    assert trackers.wandb_mode("auto", no_credentials(tmp_path, WANDB_MODE="disabled")).mode == "disabled"
    assert trackers.wandb_mode("auto", no_credentials(tmp_path, WANDB_DISABLED="true")).mode == "disabled"
    assert trackers.wandb_mode("offline", no_credentials(tmp_path, WANDB_API_KEY="k")).mode == "offline"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    found = trackers.wandb_mode("auto", {"NETRC": str(netrc)})
    assert found.mode == "online" and str(netrc) in found.why
    assert trackers.wandb_mode("auto", {"NETRC": str(netrc), "WANDB_BASE_URL": "https://wandb.corp"}).mode == "offline"


def test_wandb_online_without_credentials_runs_offline_instead_of_prompting(tmp_path):
    for requested, env in (("online", {}), ("auto", {"WANDB_MODE": "online"})):
        mode = trackers.wandb_mode(requested, no_credentials(tmp_path, **env))
        assert mode.mode == "offline" and mode.asked_online_without_credentials and "WANDB_API_KEY" in mode.why


def test_mlflow_store_the_recipe_then_the_environment_then_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    assert trackers.mlflow_uri("http://a", {"MLFLOW_TRACKING_URI": "http://b"}, run_dir) == (
        "http://a", "trainer.mlflow.tracking_uri")
    assert trackers.mlflow_uri(None, {"MLFLOW_TRACKING_URI": "http://b"}, run_dir)[0] == "http://b"
    uri, _ = trackers.mlflow_uri(None, {}, run_dir)
    assert uri == f"sqlite:///{run_dir.resolve()}/mlflow.db" and trackers.mlflow_needs_sql(uri)
    assert not trackers.mlflow_needs_sql("http://b")


def test_state_file_round_trip(tmp_path):
    assert trackers.read_state(tmp_path) == {}
    trackers.write_state(tmp_path, {"wandb": {"id": "abc"}})
    assert trackers.read_state(tmp_path) == {"wandb": {"id": "abc"}}
    (tmp_path / trackers.STATE_FILE).write_text("{half")
    assert trackers.read_state(tmp_path) == {}


# -------------------------------------------------------------------------------------- records and metrics
def test_metrics_of_a_record_are_split_slash_name_with_the_epoch():
    record = {"split": "train", "step": 20, "epoch": 1, "loss": 0.5, "accuracy": 0.75, "lr": 0.1, "time": 1.0}
    assert metrics_of(record) == {"train/epoch": 1.0, "train/loss": 0.5, "train/accuracy": 0.75, "train/lr": 0.1}


def test_backlog_keeps_each_steps_last_record_up_to_the_checkpoint(tmp_path):
    lines = [{"split": "train", "step": 5, "loss": 1.0}, {"split": "train", "step": 10, "loss": 2.0},
             {"split": "event", "event": "tracker_failed", "step": 10},
             {"split": "train", "step": 15, "loss": 3.0},  # after the checkpoint at 10: replayed by the resume
             {"split": "train", "step": 10, "loss": 2.5}, {"split": "val", "step": 10, "loss": 9.0}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n{partial")
    got = [(r["split"], r["step"], r["loss"]) for r in backlog(path, through=10)]
    assert got == [("train", 5, 1.0), ("train", 10, 2.5), ("val", 10, 9.0)]


def test_event_records_go_to_metrics_jsonl_not_to_tensorboard(tmp_path):
    writer = MetricsWriter(tmp_path)
    seen = []
    writer._tb.add_scalars = lambda step, scalars, wall_time=None: seen.append(scalars)
    writer.write({"split": "train", "step": 1, "loss": 0.5})
    writer.write({"split": "event", "event": "tracker_failed", "tracker": "wandb", "step": 1, "error": "x"})
    writer.close()
    assert seen == [{"train/loss": 0.5}]
    assert [json.loads(line)["split"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        "train", "event"]


# ------------------------------------------------------------------------------------- the tracking thread
class Reporter:
    def __init__(self):
        self.warnings, self.messages = [], []

    def warn(self, text):
        self.warnings.append(text)

    def message(self, text):
        self.messages.append(text)


class FakeSink:
    """Stands in for a tracker: records what it is sent; raises at ``fail_at``; blocks in finish with ``hang``."""

    def __init__(self, name, fail_at=None, fail_start=False, hang=None):
        self.name, self.fail_at, self.fail_start, self.hang = name, fail_at, fail_start, hang
        self.title = trackers.SPECS[name].title
        self.logged, self.finished, self.ctx = [], None, None

    def start(self, ctx):
        if self.fail_start:
            raise ConnectionError("network is unreachable")
        self.ctx = ctx
        return Started({"id": ctx.run_id or f"{self.name}-run"}, f"{self.title}: started")

    def log(self, step, metrics, wall_time):
        if step == self.fail_at:
            raise OSError(28, "No space left on device")
        self.logged.append((step, metrics))

    def finish(self, status, checkpoints):
        if self.hang is not None:
            self.hang.wait()
        self.finished = (status, checkpoints)


def open_tracking(tmp_path, monkeypatch, sinks, overrides=(), resumed_at=None, checkpoint_ids=None):
    monkeypatch.setattr(tracking_mod, "make_sink", lambda name: sinks[name])
    loggers = ",".join(sinks)
    cfg = OmegaConf.create(OmegaConf.to_container(load_recipe(QUICK, [f"trainer.loggers=[{loggers}]", *overrides])))
    events, reporter = [], Reporter()
    t = Tracking.open(cfg, tmp_path, {"world_size": "2"}, resumed_at, checkpoint_ids, events.append, reporter)
    return t, events, reporter


def train(step, loss=0.5):
    return {"split": "train", "step": step, "epoch": 1, "loss": loss, "time": 100.0 + step}


def test_every_record_reaches_every_tracker_and_the_run_ends_with_its_status(tmp_path, monkeypatch):
    sinks = {"wandb": FakeSink("wandb"), "mlflow": FakeSink("mlflow")}
    t, events, reporter = open_tracking(tmp_path, monkeypatch, sinks)
    wandb_id = t.ids()["wandb"]  # chosen before the tracker starts: the first checkpoint already has it
    assert len(wandb_id) == 8
    for step in (10, 20):
        t.log(train(step))
    t.log({"split": "event", "event": "x", "step": 20})  # not a metric
    t.log({"split": "val", "step": 20, "epoch": 1, "loss": 0.25, "time": 1.0})
    t.close("finished", {"last": "/r/last.pt"})
    for sink in sinks.values():
        assert [s for s, _ in sink.logged] == [10, 20, 20]
        assert sink.logged[2][1] == {"val/epoch": 1.0, "val/loss": 0.25}
        assert sink.finished == ("finished", {"last": "/r/last.pt"})
        assert sink.ctx.recipe["optim"]["lr"] == 0.05 and sink.ctx.tags == {"world_size": "2"}
    state = trackers.read_state(tmp_path)
    assert state["wandb"]["id"] == wandb_id and state["mlflow"]["id"] == "mlflow-run"
    assert state["mlflow"]["status"] == "finished" and state["mlflow"]["logged"] == {"train": 20, "val": 20}
    assert reporter.warnings == [] and sorted(reporter.messages) == ["MLflow: started", "W&B: started"]
    assert events == []


def test_a_tracker_that_raises_is_switched_off_with_one_warning_and_an_event(tmp_path, monkeypatch):
    sinks = {"wandb": FakeSink("wandb", fail_at=20), "mlflow": FakeSink("mlflow")}
    t, events, reporter = open_tracking(tmp_path, monkeypatch, sinks)
    for step in (10, 20, 30, 40):
        t.log(train(step))
    t.close("finished", {})
    assert [s for s, _ in sinks["wandb"].logged] == [10] and sinks["wandb"].finished is None
    assert [s for s, _ in sinks["mlflow"].logged] == [10, 20, 30, 40]  # the other tracker goes on
    (warning,) = reporter.warnings
    assert warning.startswith("W&B failed while logging step 20 (OSError: [Errno 28] No space left on device)")
    (event,) = events
    assert event["split"] == "event" and event["tracker"] == "wandb" and event["step"] == 20
    failure = trackers.read_state(tmp_path)["wandb"]["failures"][0]
    assert failure["while"] == "logging step 20" and "No space left" in failure["error"]


def test_a_tracker_that_cannot_start_leaves_training_alone(tmp_path, monkeypatch):
    t, events, reporter = open_tracking(tmp_path, monkeypatch, {"mlflow": FakeSink("mlflow", fail_start=True)})
    t.log(train(10))
    t.close("failed", {})
    assert reporter.warnings[0].startswith("MLflow failed while starting (ConnectionError: network is unreachable)")
    assert len(events) == 1 and t.ids() == {}


def test_a_hung_tracker_does_not_hold_the_end_of_the_run(tmp_path, monkeypatch):
    hang = threading.Event()
    monkeypatch.setitem(tracking_mod.FINISH_TIMEOUT_S, "preempted", 0.2)
    t, _, reporter = open_tracking(tmp_path, monkeypatch, {"wandb": FakeSink("wandb", hang=hang)})
    t.close("preempted", {})
    hang.set()
    assert "W&B did not finish within 0.2 s" in reporter.warnings[0]


def test_a_resumed_run_continues_each_trackers_run_and_sends_each_step_once(tmp_path, monkeypatch):
    # the earlier attempt: W&B took steps 5-15 (then the job crashed), MLflow never started; the checkpoint is at 10
    trackers.write_state(tmp_path, {"wandb": {"id": "w1", "logged": {"train": 15}}, "mlflow": {"id": None}})
    lines = [train(5, 1.0), train(10, 2.0), {"split": "val", "step": 10, "loss": 3.0}, train(15, 4.0)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    sinks = {"wandb": FakeSink("wandb"), "mlflow": FakeSink("mlflow")}
    t, _, reporter = open_tracking(tmp_path, monkeypatch, sinks, resumed_at=10, checkpoint_ids={"mlflow": "m0"})
    for step in (15, 20):  # the resumed run replays step 15
        t.log(train(step, 5.0))
    t.close("finished", {})
    assert sinks["wandb"].ctx.run_id == "w1" and sinks["wandb"].ctx.continuing
    assert [(s, m.get("train/loss", m.get("val/loss"))) for s, m in sinks["wandb"].logged] == [(10, 3.0), (20, 5.0)]
    assert sinks["mlflow"].ctx.run_id == "m0"  # not in trackers.json: the checkpoint's id
    assert [s for s, _ in sinks["mlflow"].logged] == [5, 10, 10, 15, 20]  # caught up from metrics.jsonl first
    assert "MLflow: sent 3 earlier record(s) it had missed (from metrics.jsonl)" in reporter.messages


def test_a_fresh_start_in_a_used_run_dir_starts_new_tracker_runs(tmp_path, monkeypatch):
    trackers.write_state(tmp_path, {"wandb": {"id": "old", "logged": {"train": 99}}})
    sinks = {"wandb": FakeSink("wandb")}
    t, _, _ = open_tracking(tmp_path, monkeypatch, sinks)
    t.log(train(10))
    t.close("finished", {})
    assert sinks["wandb"].ctx.run_id != "old" and not sinks["wandb"].ctx.continuing
    assert [s for s, _ in sinks["wandb"].logged] == [10]


# ------------------------------------------------------------------------------------- doctor and post-mortem
def test_doctor_shows_each_tracker_installed_and_its_mode():
    absent = sw.check_tracker(Observation(), "wandb")
    assert absent.status == "skipped" and "mgpu[wandb]" in absent.detail
    offline = Observation(trackers=(TrackerInfo("wandb", "0.31.0", "offline", "no W&B credentials"),))
    r = sw.check_tracker(offline, "wandb")
    assert r.status == "ok" and "runs log offline" in r.detail and "wandb sync" in r.detail
    stuck = Observation(trackers=(TrackerInfo("wandb", "0.31.0", "offline", "x", problem="WANDB_MODE=online asks"),))
    assert sw.check_tracker(stuck, "wandb").status == "warn" and "wandb login" in sw.check_tracker(stuck, "wandb").hint
    served = Observation(trackers=(TrackerInfo("mlflow", "3.1.0", "http://m:5000", "MLFLOW_TRACKING_URI"),))
    assert sw.check_tracker(served, "mlflow").detail == "mlflow 3.1.0; runs go to http://m:5000 (MLFLOW_TRACKING_URI)"
    no_sql = Observation(trackers=(TrackerInfo("mlflow", "3.1.0", "sqlite:///x", "y", problem="needs sqlalchemy"),))
    r = sw.check_tracker(no_sql, "mlflow")
    assert r.status == "warn" and "mgpu[mlflow]" in r.hint


def test_doctor_observes_the_trackers_of_this_environment(tmp_path):
    seen = {t.name: t for t in observe_trackers(no_credentials(tmp_path, MLFLOW_TRACKING_URI="http://m:5000"))}
    assert set(seen) == {"wandb", "mlflow"}
    if seen["mlflow"].version is not None:
        assert (seen["mlflow"].mode, seen["mlflow"].why) == ("http://m:5000", "MLFLOW_TRACKING_URI")
    if seen["wandb"].version is not None:
        assert seen["wandb"].mode == "offline" and not seen["wandb"].problem


def test_post_mortem_lines_say_where_each_run_is_and_which_failed():
    lines = tracker_lines({
        "wandb": {"id": "w1", "status": "finished", "mode": "offline", "sync": "wandb sync RUN/wandb/offline-run-*-w1"},
        "mlflow": {"id": "m1", "status": "running", "failures": [{"while": "logging step 40", "error": "OSError: x"}]},
    })
    assert lines == [
        ("MLflow run m1: failed while logging step 40 (OSError: x); training went on without it, and metrics.jsonl has "
         "every record", True),
        ("W&B run w1 (finished, offline): wandb sync RUN/wandb/offline-run-*-w1", False),
    ]
