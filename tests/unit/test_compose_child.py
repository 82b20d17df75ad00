"""The recipe composed in a child process while the launcher imports torch (mgpucli/launch/compose_child.py)."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from mgpucli.config import load_recipe
from mgpucli.errors import RecipeError, UsageError
from mgpucli.launch.compose_child import Composing


def test_the_child_composes_the_recipe_the_launcher_would():
    overrides = ["optim.lr=0.2", "trainer.device=cpu", "+model.dropout=0.1"]
    composing = Composing("quickstart", overrides)
    try:
        got = composing.result()
    finally:
        composing.close()
    assert OmegaConf.to_container(got) == OmegaConf.to_container(load_recipe("quickstart", overrides))


def test_the_childs_problems_are_the_launchers_error():
    composing = Composing("quickstart", ["trainer.epochs=-1", "trainer.strategy=nope"])
    try:
        with pytest.raises(RecipeError) as err:
            composing.result()
    finally:
        composing.close()
    with pytest.raises(RecipeError) as here:
        load_recipe("quickstart", ["trainer.epochs=-1", "trainer.strategy=nope"])
    assert (err.value.problems, err.value.message) == (here.value.problems, here.value.message)
    assert len(err.value.problems) == 2


def test_a_recipe_that_is_not_there_is_the_same_usage_error(tmp_path):
    composing = Composing(str(tmp_path / "nope.yaml"), [])
    try:
        with pytest.raises(UsageError) as err:
            composing.result()
    finally:
        composing.close()
    with pytest.raises(UsageError) as here:
        load_recipe(str(tmp_path / "nope.yaml"), [])
    assert (type(err.value), err.value.message, err.value.hint) == (type(here.value), here.value.message,
                                                                     here.value.hint)


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
