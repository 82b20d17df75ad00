"""A tracker added through the registry alone (mgpucli.trackers.register, nothing else of mgpu changed) is checked
by ``--check``, shown by ``mgpu doctor``, gets rank 0's records, and ``mgpu doctor RUN_DIR`` says where its run is.

The tracker (tests/e2e/fake_tracker: its registry entry in a sitecustomize on PYTHONPATH, its client module with
its package metadata, its sink) is registered in every process a test starts, as a plugin would be.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e.test_launch import RECIPE, SHORT, run_launch
from tests.procs import mgpu

PLUGIN = Path(__file__).parent / "fake_tracker"
NOTEBOOK = ["trainer.loggers=[notebook]", "trainer.notebook.folder=pages"]


def plugin_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MGPU_FAULT", "NOTEBOOK_"))}
    return {**env, "PYTHONPATH": os.pathsep.join([str(PLUGIN), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            **extra}


def test_the_doctor_shows_a_registered_tracker_and_its_mode(tmp_path: Path):
    res = mgpu("doctor", "--quick", "--json", cwd=tmp_path, env=plugin_env(NOTEBOOK_SHELF="/shelf"), timeout=120)
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["Notebook"]["status"] == "ok", checks["Notebook"]
    assert checks["Notebook"]["detail"] == "notebook_tracker 1.0; pages go to /shelf (NOTEBOOK_SHELF)"
    res = mgpu("doctor", "--quick", "--json", cwd=tmp_path, env=plugin_env(), timeout=120)
    notebook = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "Notebook")
    assert notebook["status"] == "warn" and notebook["hint"] == "export NOTEBOOK_SHELF=/shelf", notebook


def test_check_takes_its_options_and_refuses_a_wrong_one(tmp_path: Path):
    ok = mgpu("launch", "--cpu", "--nproc", "2", "--check", RECIPE, *NOTEBOOK, cwd=tmp_path, env=plugin_env())
    assert ok.returncode == 0, ok.output
    assert "folder: pages" in ok.stdout and "style: plain" in ok.stdout
    bad = mgpu("launch", "--cpu", "--nproc", "2", "--check", RECIPE, *NOTEBOOK, "trainer.notebook.style=loud",
               cwd=tmp_path, env=plugin_env())
    assert bad.returncode == 2, bad.output
    assert "trainer.notebook.style: 'loud' is not one of plain, fancy" in bad.stderr


def test_a_run_logs_to_it_and_the_post_mortem_says_where_its_run_is(tmp_path: Path, tag: str):
    run_dir = tmp_path / "run"
    code, launch = run_launch(["--cpu", "--nproc", "2", RECIPE, *SHORT, *NOTEBOOK, f"run_dir={run_dir}"], tmp_path,
                              tag, plugin_env())
    assert code == 0, launch.output
    pages = [json.loads(line) for line in (run_dir / "pages" / "pages.jsonl").read_text().splitlines()]
    assert pages and all("train/loss" in p or "val/loss" in p for p in pages)
    assert json.loads((run_dir / "trackers.json").read_text())["notebook"]["id"] == "nb-0001"
    res = mgpu("doctor", str(run_dir), cwd=tmp_path, env=plugin_env(), timeout=60)
    assert f"Notebook run nb-0001 (finished): {run_dir / 'pages' / 'pages.jsonl'}" in res.stderr, res.output
