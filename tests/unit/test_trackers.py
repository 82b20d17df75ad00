"""Experiment trackers without a tracker: the recipe keys and checks, the mode and store rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpucli import trackers
from mgpucli.config import check_recipe, load_recipe
from mgpucli.config.tracker_check import tracker_problems
from mgpucli.errors import RecipeError
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
