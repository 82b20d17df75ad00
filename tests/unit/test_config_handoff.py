"""The launcher's checked recipe handed to its workers (mgpucli.config.handoff)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from mgpucli.config import handoff, load_recipe

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml")


def test_a_worker_gets_exactly_the_recipe_the_launcher_checked(tmp_path, monkeypatch):
    overrides = ["optim.lr=0.1", "trainer.device=cpu"]
    cfg = load_recipe(RECIPE, overrides)
    monkeypatch.setenv(handoff.ENV, str(handoff.write(cfg, RECIPE, overrides, tmp_path)))
    got = handoff.read(RECIPE, overrides)
    assert got is not None and OmegaConf.to_container(got) == OmegaConf.to_container(cfg)
    assert got.optim.lr == 0.1 and got.trainer.device == "cpu"


def test_other_arguments_or_no_file_mean_compose_as_usual(tmp_path, monkeypatch):
    cfg = load_recipe(RECIPE, [])
    path = handoff.write(cfg, RECIPE, [], tmp_path)
    assert handoff.read(RECIPE, []) is None  # not launched by mgpu launch: no MGPU_CHECKED_RECIPE
    monkeypatch.setenv(handoff.ENV, str(path))
    assert handoff.read(RECIPE, ["optim.lr=0.1"]) is None  # other overrides
    edited = tmp_path / "edited.yaml"
    edited.write_text(Path(RECIPE).read_text() + "\n# edited\n")
    assert handoff.read(str(edited), []) is None  # other bytes
    path.write_text("{not json")
    assert handoff.read(RECIPE, []) is None
    monkeypatch.setenv(handoff.ENV, str(tmp_path / "missing.json"))
    assert handoff.read(RECIPE, []) is None


def test_a_shipped_name_and_its_path_have_one_fingerprint(tmp_path, monkeypatch):
    """Nodes of one job may name the recipe differently; the run id and the handoff go by the file's bytes."""
    monkeypatch.chdir(tmp_path)  # no ./quickstart here: the name means the shipped recipe
    assert handoff.fingerprint("quickstart", ["optim.lr=0.1"]) == handoff.fingerprint(RECIPE, ["optim.lr=0.1"])
    assert handoff.fingerprint("quickstart", []) != handoff.fingerprint("quickstart", ["optim.lr=0.1"])
    assert handoff.fingerprint("quickstart", []) != handoff.fingerprint("digits", [])
    assert handoff.fingerprint("no-such-recipe", []) != handoff.fingerprint("other-missing", [])  # no error
