"""Recipe loading, Hydra overrides, the typed schema's collected errors, and _target_ checks."""

from __future__ import annotations

import textwrap

import pytest

from mgpucli.config import check_recipe, load_recipe
from mgpucli.config.targets import build
from mgpucli.errors import RecipeError
from tests.procs import RECIPES

BASE = """
name: demo
seed: 1
model: {_target_: torch.nn.Linear, in_features: 4, out_features: 2}
optim: {_target_: torch.optim.SGD, lr: 0.1}
data:
  train: {_target_: mgpucli.components.datasets.SyntheticClassification, num_samples: 64, num_features: 4,
          num_classes: 2}
  batch_size: 8
trainer:
  epochs: 2
"""


@pytest.fixture
def recipe(tmp_path):
    def write(text: str = BASE, name: str = "r.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def problems(path, overrides=(), check=False) -> list[str]:
    with pytest.raises(RecipeError) as info:
        cfg = load_recipe(path, list(overrides))
        if check:
            check_recipe(cfg, str(path))
    assert str(path) in str(info.value)  # every report names the recipe file
    return info.value.problems


def test_defaults_interpolation_and_overrides(recipe):
    cfg = load_recipe(recipe(), ["trainer.max_steps=5", "optim.lr=0.2", "+optim.momentum=0.9", "~seed"])
    assert cfg.run_dir == "runs/demo"  # default with interpolation resolved
    assert cfg.trainer.max_steps == 5  # a schema key the recipe doesn't mention: plain key=value works
    assert cfg.optim.lr == 0.2 and cfg.optim.momentum == 0.9
    assert cfg.seed == 0  # removed with ~, back to the schema default
    assert cfg.trainer.strategy == "auto" and cfg.data.num_workers == "auto"


def test_recipe_in_any_directory_and_yml_suffix(recipe, tmp_path):
    (tmp_path / "deep" / "er").mkdir(parents=True)
    path = tmp_path / "deep" / "er" / "x.yml"
    path.write_text(BASE)
    assert load_recipe(path).name == "demo"


def test_every_schema_problem_is_reported_together(recipe):
    found = problems(recipe(), ["trainer.epcohs=3", "data.batch_size=0", "seed=abc", "trainer.strategy=fast"])
    text = "\n".join(found)
    assert "trainer.epcohs: unknown key (did you mean 'trainer.epochs'?)" in text
    assert "seed: Value 'abc' of type 'str' could not be converted to Integer" in text
    assert "data.batch_size: must be >= 1, got 0" in found  # value checks run beside type errors
    assert any(p.startswith("trainer.strategy: 'fast'") for p in found)
    assert len(found) == 4


def test_value_constraints_are_collected(recipe):
    found = problems(recipe(), ["data.batch_size=0", "trainer.strategy=fast", "trainer.grad_accum=0"])
    assert "data.batch_size: must be >= 1, got 0" in found
    assert "trainer.grad_accum: must be >= 1, got 0" in found
    assert any(p.startswith("trainer.strategy: 'fast' is not one of auto, single, ddp, dp") for p in found)


def test_unknown_top_level_key_and_missing_sections(recipe):
    found = problems(recipe("name: x\ntrainr: {epochs: 1}\n"))
    text = "\n".join(found)
    assert "trainr: unknown key (did you mean 'trainer'?)" in text
    for section in ("model", "optim", "data"):
        assert f"{section}: missing required section" in text


def test_missing_required_value(recipe):
    found = problems(recipe(BASE.replace("name: demo\n", "")))
    assert "name: missing required value" in found


def test_wrong_type_for_a_section(recipe):
    assert problems(recipe(), ["trainer=5"]) == ["trainer: expected a section (mapping), got 5"]


def test_an_optional_section_given_takes_its_defaults_and_is_checked_key_by_key(recipe):
    cfg = load_recipe(recipe(), ["+trainer.ema.decay=0.9"])
    assert (cfg.trainer.ema.decay, cfg.trainer.ema.every) == (0.9, 1) and cfg.trainer.early_stopping is None
    found = problems(recipe(), ["+trainer.ema.decy=0.9", "trainer.loggers=wandb"])
    assert "trainer.ema.decy: unknown key (did you mean 'trainer.ema.decay'?)" in found
    assert "trainer.loggers: expected a list, e.g. 'trainer.loggers=[wandb]', got 'wandb'" in found


def test_bad_interpolation_is_named(recipe):
    assert problems(recipe(), ["run_dir=${nope}"]) == ["run_dir: Interpolation key 'nope' not found"]


def test_malformed_override(recipe):
    (msg,) = problems(recipe(), ["trainer.epochs"])
    assert "override 'trainer.epochs' is malformed" in msg and "+key=value" in msg


def test_component_key_set_or_added_like_a_recipe_line(recipe):
    cfg = load_recipe(recipe(), ["optim.weight_decay=0.01", "model.bias=false"])  # not in the recipe: added
    check_recipe(cfg, "r.yaml")
    assert cfg.optim.weight_decay == 0.01 and cfg.model.bias is False


@pytest.mark.parametrize("override", ["optim.lrr=0.1", "+optim.lrr=0.1"])
def test_component_typo_gets_a_did_you_mean_from_the_signature_never_a_plus(recipe, override):
    assert load_recipe(recipe(), [override]).optim.lrr == 0.1  # loading adds it; the signature check judges it
    (msg,) = problems(recipe(), [override], check=True)
    assert msg == "optim.lrr: torch.optim.SGD takes no argument 'lrr' (did you mean 'lr'?)"
    assert "+optim" not in msg


def test_typos_in_nested_targets_and_several_at_once(recipe):
    text = BASE.replace("  train: {_target_: mgpucli.components.datasets.SyntheticClassification, ",
                        "  train: {_target_: torch.utils.data.Subset, indices: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],\n"
                        "          dataset: {_target_: mgpucli.components.datasets.SyntheticClassification, ")
    text = text.replace("num_classes: 2}", "num_classes: 2}}", 1)
    found = problems(recipe(text), ["data.train.dataset.num_sampls=10", "model.in_feat=4", "optim.zzz=1"], check=True)
    assert sorted(found) == [
        "data.train.dataset.num_sampls: mgpucli.components.datasets.SyntheticClassification takes no argument "
        "'num_sampls' (did you mean 'num_samples'?)",
        "model.in_feat: torch.nn.Linear takes no argument 'in_feat' (did you mean 'in_features'?)",
        # no close name: the arguments a recipe can set (not params, which mgpu passes)
        "optim.zzz: torch.optim.SGD takes no argument 'zzz' (it takes lr, momentum, dampening, weight_decay, "
        "nesterov, maximize, foreach, differentiable, fused)",
    ]


def test_a_typo_beside_a_missing_argument_reports_both(recipe):
    found = problems(recipe(), ["~model.out_features", "model.in_featurs=4"], check=True)
    assert "model.in_featurs: torch.nn.Linear takes no argument 'in_featurs' (did you mean 'in_features'?)" in found
    assert any(p.startswith("model: arguments don't fit torch.nn.Linear") and "out_features" in p for p in found)


def test_free_form_vars_keep_hydras_plus_rule(recipe):
    (msg,) = problems(recipe(BASE + "vars: {width: 4}\n"), ["vars.widht=8"])
    assert "+vars.widht=8" in msg
    assert load_recipe(recipe(BASE + "vars: {width: 4}\n"), ["vars.width=8"]).vars.width == 8


def test_yaml_syntax_error_names_the_line(recipe):
    (msg,) = problems(recipe("name: x\ntrainer:\n  epochs: [1\n"))
    assert msg.startswith("YAML syntax error at line") and "line 4" in msg or "line 3" in msg


def test_missing_file(tmp_path):
    (msg,) = problems(tmp_path / "nope.yaml")
    assert "does not exist" in msg


def test_target_checks_import_callable_and_signature(recipe):
    found = problems(recipe(), ["optim._target_=torch.optim.Nope", "+model.bogus=1",
                                "data.train._target_=math.pi"], check=True)
    text = "\n".join(found)
    assert "optim._target_: 'torch.optim.Nope' does not import" in text
    assert "model.bogus: torch.nn.Linear takes no argument 'bogus'" in text
    assert "data.train._target_: 'math.pi' is float, not something callable" in text


def test_missing_required_argument(recipe):
    (msg,) = problems(recipe(), ["~model.out_features"], check=True)
    assert "model: arguments don't fit torch.nn.Linear" in msg and "out_features" in msg


def test_partial_and_nested_components_build(recipe):
    text = BASE + textwrap.dedent("""
    scheduler: {_target_: torch.optim.lr_scheduler.StepLR, step_size: 2}
    task:
      _target_: mgpucli.engine.tasks.Classification
    """)
    cfg = load_recipe(recipe(text), ["+optim._partial_=true"])
    check_recipe(cfg, "r.yaml")
    model = build(cfg.model)
    make_optim = build(cfg.optim)  # _partial_: a functools.partial waiting for the parameters
    optim = make_optim(model.parameters())
    sched = build(cfg.scheduler, optim)
    assert sched.step_size == 2 and optim.defaults["lr"] == 0.1


@pytest.mark.parametrize("name", ["quickstart", "digits", "charlm"])
def test_shipped_recipes_pass_checking(name):
    cfg = load_recipe(RECIPES / f"{name}.yaml")
    check_recipe(cfg, name)
    assert cfg.description


def test_cifar_recipe_checks_when_torchvision_is_importable():
    pytest.importorskip("torchvision")
    cfg = load_recipe(RECIPES / "cifar10-resnet18.yaml")
    check_recipe(cfg, "cifar10-resnet18")
    assert cfg.trainer.precision == "bf16" and cfg.trainer.channels_last
