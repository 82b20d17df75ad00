"""A recipe's Hugging Face source (mgpucli/hub.py): a local directory misspelt gets a did-you-mean from the
directories next to it before it is taken for a Hub id; the Hub's answers are given to the check, not asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpucli import hub


@pytest.fixture
def beside(tmp_path: Path, monkeypatch) -> Path:
    """A working directory holding the directories tiny-bert and models/tiny-bert; nothing in the Hub cache."""
    (tmp_path / "tiny-bert").mkdir()
    (tmp_path / "models" / "tiny-bert").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("a file is no model directory")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(hub.OFFLINE_ENV, raising=False)
    monkeypatch.setattr(hub, "in_cache", lambda source, kind: False)
    return tmp_path


def never_asked(source: str, kind: str):
    raise AssertionError(f"the Hub was asked about {source}")


def test_a_misspelt_directory_the_hub_does_not_have_is_refused_with_the_directory(beside):
    said = hub.source_problem("model.name", "tiny-bret", "model", reachable=lambda: True, has=lambda s, k: False)
    assert said == "model.name: tiny-bret is not a directory here (did you mean tiny-bert?), nor a model on the " \
                   "Hugging Face Hub"
    said = hub.source_problem("data.train.tokenizer", "models/tiny-bret", "model", reachable=lambda: True,
                              has=lambda s, k: False)
    assert "models/tiny-bret is not a directory here (did you mean models/tiny-bert?)" in said


def test_a_name_close_to_a_directory_that_the_hub_has_is_a_hub_id(beside):
    assert hub.source_problem("model.name", "tiny-bret", "model", reachable=lambda: True, has=lambda s, k: True) \
        is None


def test_offline_the_misspelt_directory_and_the_download_are_both_offered(beside, monkeypatch):
    monkeypatch.setenv(hub.OFFLINE_ENV, "1")
    said = hub.source_problem("model.name", "tiny-bret", "model", reachable=never_asked, has=never_asked)
    assert said.startswith("model.name: tiny-bret is not a directory here (did you mean tiny-bert?); as a Hub id")
    assert "HF_HUB_OFFLINE is set" in said and "`hf download tiny-bret`" in said
    monkeypatch.delenv(hub.OFFLINE_ENV)
    unsure = hub.source_problem("model.name", "tiny-bret", "model", reachable=lambda: True, has=lambda s, k: None)
    assert "(did you mean tiny-bert?)" in unsure and "the Hub did not say whether it has it" in unsure


def test_a_hub_id_with_no_directory_close_to_it_is_left_to_the_hub(beside):
    for source in ("bert-base-uncased", "google/bert_uncased_L-2_H-128_A-2", "notes.tx"):
        assert hub.source_problem("model.name", source, "model", reachable=lambda: True, has=never_asked) is None
    assert hub.closest_directory("notes.tx") is None  # a file is no model directory
    assert hub.closest_directory("google/bert") is None  # no folder google here: a Hub id's organisation
