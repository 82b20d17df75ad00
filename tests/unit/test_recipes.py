"""The shipped-recipe resolver: a path wins, then a shipped name, else exit 2 with the names and a guess."""

from __future__ import annotations

import pytest

from mgpucli import recipes
from mgpucli.errors import RecipeError, UsageError
from tests.procs import RECIPES

SHIPPED = sorted(p.stem for p in RECIPES.glob("*.yaml"))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_checkout_recipes_are_the_shipped_ones():
    # In a checkout (or an editable install) the repo's recipes/ is the one source; a wheel has its own copy.
    assert recipes.recipes_dir() == RECIPES
    assert recipes.shipped_names() == SHIPPED and "quickstart" in SHIPPED


def test_a_name_resolves_to_the_shipped_file(in_tmp):
    assert recipes.resolve("quickstart") == RECIPES / "quickstart.yaml"


def test_an_existing_file_wins_over_a_shipped_name(in_tmp):
    (in_tmp / "quickstart").write_text("name: mine\n")
    assert recipes.resolve("quickstart").resolve() == (in_tmp / "quickstart").resolve()


def test_a_directory_does_not_hide_a_shipped_name(in_tmp):
    (in_tmp / "digits").mkdir()  # e.g. a data folder
    assert recipes.resolve("digits") == RECIPES / "digits.yaml"


def test_a_directory_that_is_no_name_is_not_a_file(in_tmp):
    (in_tmp / "conf").mkdir()
    with pytest.raises(RecipeError, match="conf is not a file"):
        recipes.resolve("conf")


@pytest.mark.parametrize("typo, guess", [("quickstrat", "quickstart"), ("digit", "digits"),
                                         ("cifar", "cifar10-resnet18"), ("CharLM", "charlm")])
def test_an_unknown_name_lists_the_names_and_guesses(in_tmp, typo, guess):
    with pytest.raises(UsageError) as info:
        recipes.resolve(typo)
    err = info.value
    assert err.exit_code == 2 and not isinstance(err, RecipeError)
    assert f"unknown recipe '{typo}'" in err.message and f"did you mean '{guess}'?" in err.message
    assert f"Shipped recipes: {', '.join(SHIPPED)}" in err.hint


def test_no_guess_when_nothing_is_close(in_tmp):
    with pytest.raises(UsageError) as info:
        recipes.resolve("zzzz")
    assert "did you mean" not in str(info.value) and "Shipped recipes:" in str(info.value)


def test_a_missing_path_names_the_file_and_the_shipped_recipe_of_that_stem(in_tmp):
    with pytest.raises(RecipeError) as info:
        recipes.resolve("recipes/quickstart.yaml")  # the README's path, typed outside the checkout
    assert info.value.problems == ["recipe file recipes/quickstart.yaml does not exist"]
    assert "pass just the name (quickstart)" in info.value.hint
    with pytest.raises(RecipeError) as info:
        recipes.resolve("mine.yaml")
    assert "does not exist" in str(info.value) and "ships a recipe" not in str(info.value)


def test_describe_reads_description_and_requires_from_the_file():
    digits = recipes.describe("digits")
    assert digits.description.startswith("scikit-learn's 8x8 handwritten digits")
    (req,) = digits.requires
    assert req.module == "sklearn" and req.label == "the examples extra (scikit-learn)"
    assert req.install_hint == "pip install 'mgpu[examples]'"
    assert recipes.describe("quickstart").requires == () and recipes.describe("quickstart").ready


def test_installed_is_looked_up_not_assumed(tmp_path, monkeypatch):
    (tmp_path / "r.yaml").write_text("name: r\ndescription: x\nrequires: [json, no_such_module_mgpu]\n")
    monkeypatch.setattr(recipes, "PACKAGED_DIR", tmp_path)
    (found,) = recipes.catalogue()
    assert [(q.module, q.installed) for q in found.requires] == [("json", True), ("no_such_module_mgpu", False)]
    assert not found.ready and found.requires[1].install_hint == "pip install no_such_module_mgpu"


def test_the_packaged_copy_is_preferred_and_a_missing_one_is_reported(tmp_path, monkeypatch):
    packaged = tmp_path / "_recipes"
    packaged.mkdir()
    (packaged / "only.yaml").write_text("name: only\n")
    monkeypatch.setattr(recipes, "PACKAGED_DIR", packaged)
    assert recipes.shipped_names() == ["only"]
    monkeypatch.setattr(recipes, "PACKAGED_DIR", tmp_path / "gone")
    monkeypatch.setattr(recipes, "CHECKOUT_DIR", tmp_path / "gone-too")
    with pytest.raises(UsageError, match="shipped recipes are missing"):
        recipes.shipped_names()


def test_each_extra_a_recipe_needs_is_named_once():
    from rich.text import Text

    from mgpucli.cli.recipes import needs_line

    def line(*modules: tuple[str, bool]) -> str:
        return Text.from_markup(needs_line(tuple(recipes.Requirement(m, ok) for m, ok in modules))).plain

    assert line(("transformers", True), ("datasets", True)) == "needs: the hf extra (Transformers, datasets), installed"
    assert line(("transformers", True), ("datasets", False)) == \
        "needs: the hf extra (Transformers, datasets), not installed: pip install 'mgpu[hf]'"
    assert line(("timm", True), ("torchvision", False), ("no_such_module_mgpu", False)) == \
        ("needs: the timm extra (and a torchvision that matches your torch), installed; torchvision, not installed: "
         "pip install torchvision (the build that matches your torch); no_such_module_mgpu, not installed: "
         "pip install no_such_module_mgpu")
    assert line() == "needs: nothing extra"
    assert [q.label for q in recipes.describe("text-classification").requires] == \
        ["the hf extra (Transformers)", "the hf extra (datasets)"]  # each module's own, as --json lists them
