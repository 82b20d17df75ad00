"""The recipe composed in a child process while the launcher imports torch (mgpucli/launch/compose_child.py)."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from mgpucli.config import load_recipe
from mgpucli.errors import RecipeError, UsageError
from mgpucli.launch.compose_child import Composing, Importing


def test_the_child_composes_the_recipe_the_launcher_would():
    overrides = ["optim.lr=0.2", "trainer.device=cpu", "+model.dropout=0.1"]
    composing = Composing("quickstart", overrides)
    try:
        got = composing.result()
    finally:
        composing.close()
    assert OmegaConf.to_container(got) == OmegaConf.to_container(load_recipe("quickstart", overrides))


def _raised(recipe: str, overrides: list[str], kind: type[Exception]) -> tuple:
    """(the error the child's answer raises, the error composing here raises)."""
    composing = Composing(recipe, overrides)
    try:
        with pytest.raises(kind) as child:
            composing.result()
    finally:
        composing.close()
    with pytest.raises(kind) as here:
        load_recipe(recipe, overrides)
    return child.value, here.value


def test_the_childs_problems_are_the_launchers_error():
    child, here = _raised("quickstart", ["trainer.epochs=-1", "trainer.strategy=nope"], RecipeError)
    assert (child.problems, child.message) == (here.problems, here.message)
    assert len(child.problems) == 2


def test_a_recipe_that_is_not_there_is_the_same_usage_error(tmp_path):
    child, here = _raised(str(tmp_path / "nope.yaml"), [], UsageError)
    assert (type(child), child.message, child.hint) == (type(here), here.message, here.hint)


def test_a_child_that_gave_no_answer_leaves_the_composing_to_the_launcher():
    composing = Composing("quickstart", [])
    composing._proc.kill()  # as if the child had crashed
    try:
        assert composing.result() is None
    finally:
        composing.close()


def test_close_ends_a_child_whose_answer_nobody_reads():
    composing = Composing("quickstart", [])
    composing.close()
    assert composing._proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(composing._proc.pid, 0)


def test_an_import_in_a_thread_is_waited_for_unless_a_refusal_comes_first(tmp_path, monkeypatch):
    """The launcher imports torch's agent in a thread; a refusal found meanwhile does not wait for it."""
    import sys
    import threading
    import types

    (tmp_path / "slow_to_import.py").write_text("from release_for_test import RELEASE\nRELEASE.wait(30)\n")
    release = threading.Event()
    monkeypatch.setitem(sys.modules, "release_for_test", types.SimpleNamespace(RELEASE=release))
    monkeypatch.syspath_prepend(str(tmp_path))
    refused = threading.Event()
    importing = Importing("slow_to_import", refused)
    refused.set()  # as the targets' check does when it refuses
    assert importing.wait() is False  # not waited for
    release.set()
    importing._thread.join(30)
    assert importing.wait() is True
    sys.modules.pop("slow_to_import", None)


def test_an_import_that_fails_raises_in_the_thread_that_waits():
    with pytest.raises(ModuleNotFoundError):
        Importing("no_such_module_mgpu_51").wait()
