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
