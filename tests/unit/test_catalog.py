"""docs/components.md is generated from the docstrings and must match the code (regenerate, compare)."""

from __future__ import annotations

import inspect

import pytest

from mgpucli import catalog
from mgpucli.components import datasets, models
from mgpucli.engine import tasks
from tests.procs import REPO

DOC = REPO / catalog.OUTPUT


def test_components_md_is_up_to_date():
    assert DOC.read_text(encoding="utf-8") == catalog.render(), (
        f"{DOC} is stale: run `python -m mgpucli.catalog` and commit the result")


def test_every_public_component_is_there_with_its_docstring_and_defaults():
    text = catalog.render()
    for module in (datasets, models):
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and not name.startswith("_"):
                assert f"_target_: {module.__name__}.{name}\n" in text
                assert inspect.getdoc(cls).splitlines()[0] in text
    assert "| `num_samples` | `int` | `4096` |" in text  # SyntheticClassification's signature
    assert "| `in_features` | `int` | required |" in text and "  in_features: ???  # required" in text
    for name, cls in tasks.BUILTIN.items():
        assert f"| `{name}` | `{cls.__name__}` |" in text


def test_a_changed_docstring_or_default_changes_the_catalogue(monkeypatch):
    before = catalog.render()
    monkeypatch.setattr(models.MLP, "__doc__", "A different description.")
    assert "A different description." in catalog.render() and catalog.render() != before
    monkeypatch.undo()

    def init(self, in_features: int, out_features: int, hidden: list[int] = (7,), dropout: float = 0.5):
        pass

    monkeypatch.setattr(models.MLP, "__init__", init)
    assert "| `dropout` | `float` | `0.5` |" in catalog.render()


def test_a_component_without_a_docstring_fails_loudly(monkeypatch):
    monkeypatch.setattr(datasets.Digits, "__doc__", None)
    with pytest.raises(ValueError, match="Digits has no docstring"):
        catalog.render()


def test_main_check_and_write(tmp_path, capsys):
    out = tmp_path / "components.md"
    assert catalog.main(["--output", str(out), "--check"]) == 1  # missing counts as stale
    assert catalog.main(["--output", str(out)]) == 0 and out.read_text() == catalog.render()
    assert catalog.main(["--output", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("Digits", "Digitz"))
    assert catalog.main(["--output", str(out), "--check"]) == 1
    assert "stale" in capsys.readouterr().err
