"""The deep recipe check (``--check``): what it builds, what it reports, and that it builds no model."""

from __future__ import annotations

import sys
import textwrap

import pytest

from mgpucli.config.deep_check import check_deep, describe_sample
from mgpucli.errors import RecipeError
from tests.procs import RECIPES

QUICK = str(RECIPES / "quickstart.yaml")

USER_MODULE = textwrap.dedent('''
    import torch
    from torch.utils.data import Dataset

    BUILT = []


    class Net(torch.nn.Module):
        def __init__(self, width: int = 4):
            super().__init__()
            self.lin = torch.nn.Linear(width, 2)
            BUILT.append(self.lin.weight.device.type)


    class Data(Dataset):
        def __init__(self, size: int = 10, fail: str = ""):
            if fail == "init":
                raise ValueError("no such file: data.csv")
            self.size, self.fail = size, fail

        def __len__(self):
            return self.size

        def __getitem__(self, i):
            if self.fail == "item":
                raise KeyError("label")
            return {"x": torch.zeros(3, 2), "y": i}
''')


@pytest.fixture
def user_recipe(tmp_path, monkeypatch):
    """A recipe whose model and dataset live in a module of the working directory."""
    (tmp_path / "checkmod_user.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("checkmod_user", None)


def write(tmp_path, train: str, val: str = "") -> str:
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: r
        model: {{_target_: checkmod_user.Net, width: 4}}
        optim: {{_target_: torch.optim.SGD, lr: 0.1}}
        data:
          batch_size: 2
          train: {train}
        """) + (f"  val: {val}\n" if val else ""))
    return str(path)


def test_a_shipped_recipe_by_name_checks_out_with_its_datasets():
    result = check_deep("quickstart", ["data.val.num_samples=77"])
    assert result.shipped and result.file == RECIPES / "quickstart.yaml"
    assert result.targets == 5  # model, optim, scheduler, data.train, data.val
    assert [(d.path, d.size, d.sample) for d in result.datasets] == [
        ("data.train", 4096, "(float32[32], int64[])"), ("data.val", 77, "(float32[32], int64[])")]
    assert "num_samples: 77" in result.resolved_yaml() and "${seed}" not in result.resolved_yaml()


def test_a_path_is_not_reported_as_shipped():
    assert not check_deep(QUICK, []).shipped


def test_user_dataset_built_and_model_only_on_the_meta_device(user_recipe):
    result = check_deep(write(user_recipe, "{_target_: checkmod_user.Data, size: 5}"), [])
    assert [(d.target, d.size, d.sample) for d in result.datasets] == [
        ("checkmod_user.Data", 5, "{x: float32[3, 2], y: int}")]
    assert sys.modules["checkmod_user"].BUILT == ["meta"]  # built once, with no memory for its weights


def test_every_dataset_failure_is_reported_with_where_it_was_raised(user_recipe):
    path = write(user_recipe, "{_target_: checkmod_user.Data, fail: init}",
                 "{_target_: checkmod_user.Data, fail: item}")
    with pytest.raises(RecipeError) as info:
        check_deep(path, [])
    train, val = info.value.problems
    assert train.startswith("data.train: building checkmod_user.Data failed: ValueError: no such file: data.csv")
    assert "checkmod_user.py:" in train  # the file and line of the raise, in the user's own module
    assert val.startswith("data.val: reading the first sample of checkmod_user.Data failed: KeyError: 'label'")
    assert info.value.exit_code == 2 and "building the dataset failed" in info.value.hint


def test_an_empty_dataset_is_a_problem(user_recipe):
    with pytest.raises(RecipeError, match=r"data.train: checkmod_user.Data is empty \(0 samples\)"):
        check_deep(write(user_recipe, "{_target_: checkmod_user.Data, size: 0}"), [])


def test_target_problems_come_before_any_dataset_is_built(user_recipe):
    path = write(user_recipe, "{_target_: checkmod_user.Data, fail: init}")
    with pytest.raises(RecipeError) as info:
        check_deep(path, ["model._target_=checkmod_user.Nope"])
    assert len(info.value.problems) == 1 and "'checkmod_user.Nope' does not import" in info.value.problems[0]


def test_describe_sample():
    import torch

    assert describe_sample((torch.zeros(2, 3, dtype=torch.float16), [1, "a"])) == "(float16[2, 3], [int, str])"
    assert describe_sample(list(range(10))) == "[int, int, int, int, int, int, int, int, ...]"
