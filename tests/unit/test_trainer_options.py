"""The optional trainer features' recipe keys: defaults, values, did-you-mean, and what doesn't combine."""

from __future__ import annotations

import pytest

from mgpucli.config import load_recipe
from mgpucli.errors import RecipeError


def problems(overrides: list[str], recipe: str = "quickstart") -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe, overrides)
    return info.value.problems


def test_features_are_off_by_default():
    trainer = load_recipe("quickstart").trainer
    assert trainer.activation_checkpointing is False
    assert trainer.ema is None and trainer.early_stopping is None and trainer.profile is None


@pytest.mark.parametrize("value, expected", [("true", True), ("[Block]", ["Block"]), ("[Block,Attention]",
                                                                                      ["Block", "Attention"])])
def test_activation_checkpointing_takes_true_or_class_names(value, expected):
    cfg = load_recipe("charlm", [f"trainer.activation_checkpointing={value}"])
    assert cfg.trainer.activation_checkpointing == expected


@pytest.mark.parametrize("value", ["3", "[]", "blocks"])
def test_activation_checkpointing_refuses_other_values(value):
    assert problems([f"trainer.activation_checkpointing={value}"]) == [
        "trainer.activation_checkpointing: expected true, false or a list of module class names (e.g. [Block]), "
        f"got {value if value != 'blocks' else repr(value)}"]


def test_ema_is_on_when_its_section_is_given_with_defaults_for_the_rest():
    assert load_recipe("quickstart", ["trainer.ema={}"]).trainer.ema == {
        "decay": 0.999, "every": 1, "start_step": 0, "validate": False}
    assert load_recipe("quickstart", ["trainer.ema.decay=0.9"]).trainer.ema.decay == 0.9  # a plain key=value
    assert load_recipe("quickstart", ["trainer.ema.decay=0.9", "trainer.ema=null"]).trainer.ema is None


def test_ema_values_typos_and_shape_are_reported_together():
    found = problems(["trainer.ema={decay: 1.5, every: 0, start_step: -1, validat: true}"])
    assert found == ["trainer.ema.validat: unknown key (did you mean 'trainer.ema.validate'?)",
                     "trainer.ema.decay: must be between 0 and 1 (e.g. 0.999), got 1.5",
                     "trainer.ema.every: must be >= 1, got 0",
                     "trainer.ema.start_step: must be >= 0, got -1"]
    assert problems(["trainer.ema=0.999"]) == ["trainer.ema: expected a section (mapping), got 0.999"]


def test_early_stopping_metric_gets_a_did_you_mean_from_the_tasks_metrics():
    assert problems(["trainer.early_stopping.metric=acuracy"]) == [
        "trainer.early_stopping.metric: 'acuracy' is not a validation metric (the classification task reports loss, "
        "accuracy; did you mean 'accuracy'?)"]
    assert load_recipe("charlm", ["trainer.early_stopping.metric=perplexity"]).trainer.early_stopping == {
        "metric": "perplexity", "mode": "auto", "patience": 3, "min_delta": 0.0}


def test_early_stopping_needs_validations_and_sane_values():
    found = problems(["trainer.early_stopping={patience: 0, min_delta: -1, mode: up}", "data.val=null"])
    assert found == ["trainer.early_stopping.mode: 'up' is not one of auto, min, max",
                     "trainer.early_stopping.patience: must be >= 1, got 0",
                     "trainer.early_stopping.min_delta: must be >= 0, got -1.0",
                     "trainer.early_stopping: decides on validation metrics, but the recipe has no data.val"]
    assert problems(["trainer.early_stopping={}", "trainer.val_every=0"]) == [
        "trainer.early_stopping: decides on validation metrics, but trainer.val_every=0 never validates"]


def test_profile_window_values():
    assert load_recipe("quickstart", ["trainer.profile={}"]).trainer.profile == {"start_step": 10, "steps": 5}
    assert problems(["trainer.profile={start_step: 0, steps: 0}"]) == [
        "trainer.profile.start_step: must be >= 1, got 0", "trainer.profile.steps: must be >= 1, got 0"]
