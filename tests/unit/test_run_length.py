"""``${total_steps:}`` / ``${steps_per_epoch:}`` (mgpucli.config.run_length): unresolved through loading, the
checks and the launcher's hand-off; numbers in the trainer, from its real train loader, before the scheduler."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from mgpucli.config import check_recipe, handoff, load_recipe, run_length
from mgpucli.config.targets import build
from mgpucli.distributed.env import RankEnv
from mgpucli.distributed.runtime import Runtime, setup_process_group
from mgpucli.engine.data import build_loaders
from mgpucli.engine.reporter import NullReporter
from mgpucli.engine.trainer import Trainer
from mgpucli.errors import RecipeError
from tests.procs import RECIPES

QUICK = str(RECIPES / "quickstart.yaml")


def test_the_placeholder_survives_loading_checking_yaml_and_the_handoff(tmp_path, monkeypatch):
    cfg = load_recipe(QUICK, [])  # validated: resolved with resolve=True, then re-created
    check_recipe(cfg, QUICK)  # the _target_ binding check resolves it too
    assert OmegaConf.to_container(cfg)["scheduler"]["T_max"] == "${total_steps:}"
    assert cfg.scheduler.T_max == "${total_steps:}"  # OmegaConf 2.3 does not re-resolve a resolver's string
    assert "T_max: ${total_steps:}" in OmegaConf.to_yaml(cfg, resolve=True)  # what --check prints
    monkeypatch.setenv(handoff.ENV, str(handoff.write(cfg, QUICK, [], tmp_path)))  # the launcher -> its workers
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["recipe"]["scheduler"]["T_max"] == "${total_steps:}"
    got = handoff.read(QUICK, [])
    assert got is not None
    resolved = run_length.resolve(got, run_length.RunLength(steps_per_epoch=64, total_steps=192))
    assert resolved.scheduler.T_max == 192 and type(resolved.scheduler.T_max) is int
    assert got.scheduler.T_max == "${total_steps:}"  # resolve() made a copy, and leaves no numbers behind


def test_resolve_replaces_every_use_direct_indirect_and_inside_text(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text((RECIPES / "quickstart.yaml").read_text().replace(
        "scheduler:", "vars: {warmup: '${steps_per_epoch:}'}\nscheduler:"))
    cfg = load_recipe(path, ["scheduler._target_=torch.optim.lr_scheduler.OneCycleLR", "~scheduler.T_max",
                             "+scheduler.max_lr=0.1", "+scheduler.total_steps=${total_steps:}",
                             "+scheduler.pct_start=${vars.warmup}", "+vars.label=spe ${steps_per_epoch:}"])
    check_recipe(cfg, str(path))
    resolved = run_length.resolve(cfg, run_length.of(batches_per_epoch=10, grad_accum=1, epochs=3, max_steps=None))
    assert resolved.scheduler.total_steps == 30 and resolved.scheduler.pct_start == 10
    assert resolved.vars.label == "spe 10"


@pytest.mark.parametrize("batches, accum, epochs, max_steps, expected", [
    (128, 1, 3, None, (128, 384)),
    (64, 1, 6, None, (64, 384)),
    (65, 2, 2, None, (33, 66)),  # the epoch's last, partial accumulation still makes a step
    (64, 1, 3, 100, (64, 100)),  # max_steps is where the run stops, longer or shorter than its epochs
    (64, 1, 3, 500, (64, 500)),
])
def test_the_run_length_counts_optimizer_steps(batches, accum, epochs, max_steps, expected):
    length = run_length.of(batches, accum, epochs, max_steps)
    assert (length.steps_per_epoch, length.total_steps) == expected


def test_uses_where_the_length_is_not_known_yet_are_recipe_errors(tmp_path):
    with pytest.raises(RecipeError) as info:
        load_recipe(QUICK, ["trainer.max_steps=${total_steps:}", "run_dir=runs/${steps_per_epoch:}",
                            "data.batch_size=${steps_per_epoch:}"])
    found = info.value.problems  # once per key: not also as the typed key's failed conversion
    assert sorted(p.split(":")[0] for p in found) == ["data.batch_size", "run_dir", "trainer.max_steps"]
    assert all("known only once the run's train loader exists" in p and "scheduler or optim" in p for p in found)
    path = tmp_path / "r.yaml"
    path.write_text((RECIPES / "quickstart.yaml").read_text() + "vars: {n: '${total_steps:}'}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["model.hidden=[${vars.n}]"])  # through vars: found in the resolved recipe
    assert [p.split(":")[0] for p in info.value.problems] == ["model.hidden[0]"]
    with pytest.raises(RecipeError) as info:
        load_recipe(QUICK, ["scheduler.T_max=${total_steps:5}"])
    assert "${total_steps:} takes no arguments, got 5" in str(info.value)


@pytest.mark.parametrize("epochs", [1, 3])
def test_the_trainer_resolves_it_from_its_loader_before_the_scheduler(tmp_path, epochs):
    """One process, 4096 samples, batch 32: 128 steps an epoch; the built scheduler, the recipe the trainer
    keeps and RUN_DIR/recipe.yaml all hold the number."""
    cfg = load_recipe(QUICK, [f"run_dir={tmp_path / 'run'}", "trainer.device=cpu", f"trainer.epochs={epochs}"])
    tr = Trainer(cfg, setup_process_group(RankEnv(), "cpu", 60, 1), NullReporter())
    try:
        tr.setup()
        assert tr.trained.scheduler.T_max == 128 * epochs
        assert tr.cfg.scheduler.T_max == 128 * epochs
        assert f"T_max: {128 * epochs}\n" in (tmp_path / "run" / "recipe.yaml").read_text()
    finally:
        tr.close()


@pytest.mark.parametrize("world_size, per_rank", [(1, 128), (2, 64)])
def test_each_rank_counts_its_own_shard(world_size, per_rank):
    """What the trainer measures on each rank of N (its train loader's length), without a process group."""
    cfg = load_recipe(QUICK, ["trainer.device=cpu", "trainer.epochs=6"])
    train_set = build(cfg.data.train)
    for rank in range(world_size):
        rt = Runtime(env=RankEnv(rank=rank, world_size=world_size), device=torch.device("cpu"),
                             backend=None)
        loaders = build_loaders(train_set, None, cfg.data, cfg.seed, rt)
        length = run_length.of(len(loaders.train), cfg.trainer.grad_accum, cfg.trainer.epochs, cfg.trainer.max_steps)
        assert (length.steps_per_epoch, length.total_steps) == (per_rank, per_rank * 6)
        assert run_length.resolve(cfg, length).scheduler.T_max == per_rank * 6
