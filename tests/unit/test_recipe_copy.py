"""`mgpu recipes copy`'s file: named after its destination (or --name), every other byte as shipped."""

from __future__ import annotations

import pytest
import yaml

from mgpucli import recipe_copy
from mgpucli.errors import UsageError
from tests.procs import RECIPES

SHIPPED = sorted(p.stem for p in RECIPES.glob("*.yaml"))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _without_name_line(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("name:")]


@pytest.mark.parametrize("shipped", SHIPPED)
def test_a_copy_is_named_after_its_file_and_keeps_everything_else(in_tmp, shipped):
    copied = recipe_copy.copy_recipe(shipped, in_tmp / "my.yaml")
    assert (copied.path, copied.name, copied.run_dir) == (in_tmp / "my.yaml", "my", "runs/my")
    text, original = copied.path.read_text(), (RECIPES / f"{shipped}.yaml").read_text()
    assert yaml.safe_load(text)["name"] == "my"
    assert _without_name_line(text) == _without_name_line(original)  # comments and layout included
    assert text.count("\n") == original.count("\n")


def test_the_default_destination_keeps_the_shipped_file_byte_for_byte_and_refuses_to_overwrite(in_tmp):
    copied = recipe_copy.copy_recipe("quickstart")
    assert copied.path == in_tmp.joinpath("quickstart.yaml").relative_to(in_tmp) and copied.name == "quickstart"
    assert copied.path.read_bytes() == (RECIPES / "quickstart.yaml").read_bytes()
    copied.path.write_text("edited\n")
    with pytest.raises(UsageError) as info:
        recipe_copy.copy_recipe("quickstart")
    assert "quickstart.yaml already exists" in info.value.message and "--force" in info.value.hint
    assert copied.path.read_text() == "edited\n"  # kept
    recipe_copy.copy_recipe("quickstart", force=True)
    assert copied.path.read_bytes() == (RECIPES / "quickstart.yaml").read_bytes()


def test_copy_into_a_directory_with_a_name_or_nowhere(in_tmp):
    (in_tmp / "conf").mkdir()
    copied = recipe_copy.copy_recipe("digits", in_tmp / "conf")
    assert copied.path == in_tmp / "conf" / "digits.yaml" and copied.name == "digits"
    copied = recipe_copy.copy_recipe("digits", in_tmp / "mine.yaml", name="lr-sweep.1")
    assert copied.name == "lr-sweep.1" and copied.run_dir == "runs/lr-sweep.1"
    assert copied.path.read_text().startswith("# scikit-learn") and "\nname: lr-sweep.1\n" in copied.path.read_text()
    with pytest.raises(UsageError, match="directory .*nowhere does not exist"):
        recipe_copy.copy_recipe("digits", in_tmp / "nowhere" / "x.yaml")
    with pytest.raises(UsageError, match="unknown recipe 'digitz'"):
        recipe_copy.copy_recipe("digitz")


@pytest.mark.parametrize("bad", ["a/b", "", "../up", "-x", "my run", "${seed}"])
def test_a_name_that_cannot_be_a_run_dir_is_refused_before_writing(in_tmp, bad):
    with pytest.raises(UsageError) as info:
        recipe_copy.copy_recipe("quickstart", in_tmp / "x.yaml", name=bad)
    assert info.value.exit_code == 2 and "--name" in str(info.value)
    assert not (in_tmp / "x.yaml").exists()


@pytest.mark.parametrize("file, name", [("my recipe.yaml", "my-recipe"), ("exp.v2.yml", "exp.v2"),
                                        ("2024.yaml", "2024"), ("true.yaml", "true"), ("+++.yaml", "quickstart")])
def test_names_from_awkward_file_names_read_back_as_those_strings(in_tmp, file, name):
    copied = recipe_copy.copy_recipe("quickstart", in_tmp / file)
    assert copied.name == name and yaml.safe_load(copied.path.read_text())["name"] == name  # '2024', not 2024


def test_rename_keeps_a_comment_and_adds_a_missing_name_after_the_header():
    assert recipe_copy.rename("# top\nname: old   # why\nseed: 0\n", "new") == "# top\nname: new   # why\nseed: 0\n"
    assert recipe_copy.rename("# top\n\nseed: 0\n", "new") == "# top\n\nname: new\nseed: 0\n"
    assert recipe_copy.rename("model:\n  name: inner\nname: x\n", "y") == "model:\n  name: inner\nname: y\n"
