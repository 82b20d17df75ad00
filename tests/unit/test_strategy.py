"""Strategy resolution and the options that don't combine (pure: a fake runtime, no process group)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from mgpucli.config.schema import TrainerSchema
from mgpucli.distributed.env import RankEnv
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.activation_checkpointing import blocks_to_checkpoint, select_blocks
from mgpucli.engine.strategy import check_combinations, resolve_strategy
from mgpucli.errors import UsageError


def rt(world=2, device="cpu"):
    return Runtime(env=RankEnv(0, 0, world, world), device=torch.device(device), backend="gloo" if world > 1 else None)


def trainer(**overrides):
    cfg = OmegaConf.structured(TrainerSchema)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


@pytest.mark.parametrize("name, world, expected", [
    ("auto", 1, "single"), ("auto", 2, "ddp"), ("ddp", 1, "single"), ("fsdp", 1, "single"), ("fsdp", 2, "fsdp"),
])
def test_resolve(name, world, expected):
    assert resolve_strategy(name, rt(world)) == expected


@pytest.mark.parametrize("name, world, fragment", [
    ("dp", 1, "needs CUDA GPUs"),
    ("single", 2, "trains on one process, but 2 were started"),
])
def test_impossible_strategies(name, world, fragment):
    with pytest.raises(UsageError, match=fragment):
        resolve_strategy(name, rt(world))


def test_dp_with_several_processes_on_gpus_is_refused():
    with pytest.raises(UsageError, match="one process spanning the GPUs"):
        resolve_strategy("dp", rt(2, "cuda"))


@pytest.mark.parametrize("overrides, fragment", [
    ({"strategy": "fsdp", "fsdp.cpu_offload": True}, "trainer.fsdp.cpu_offload needs CUDA GPUs"),
    ({"strategy": "ddp", "fsdp.wrap": ["Block"]}, "FSDP options need strategy fsdp"),
    ({"strategy": "ddp", "checkpoint_format": "sharded"}, "checkpoint_format=sharded needs trainer.strategy=fsdp"),
    ({"strategy": "fsdp", "sync_batchnorm": True}, "sync_batchnorm is a DDP option"),
    ({"strategy": "ddp", "async_save": True}, r"async_save .* \(checkpoint_format=auto with strategy ddp"),
    ({"strategy": "fsdp", "checkpoint_format": "full", "async_save": True}, r"full ones \(checkpoint_format=full\)"),
])
def test_options_that_do_not_combine(overrides, fragment):
    with pytest.raises(UsageError, match=fragment):
        check_combinations(trainer(**overrides), rt())


def test_async_save_is_allowed_wherever_checkpoints_are_sharded():
    check_combinations(trainer(strategy="fsdp", async_save=True), rt())
    check_combinations(trainer(strategy="fsdp", checkpoint_format="sharded", async_save=True), rt())


def test_fsdp_cpu_offload_is_allowed_on_gpus():
    check_combinations(trainer(strategy="fsdp", **{"fsdp.cpu_offload": True}), rt(2, "cuda"))


def test_fsdp_wrap_targets():
    from mgpucli.components.models import CharTransformer

    model = CharTransformer(d_model=16, n_head=2, n_layer=3)
    assert len(select_blocks(model, None, "trainer.fsdp.wrap")) == 3  # default: the blocks of the ModuleList
    assert [type(m).__name__ for m in select_blocks(model, ["LayerNorm"], "x")].count("LayerNorm") == 7
    with pytest.raises(UsageError, match=r"trainer.fsdp.wrap names 'Blok' \(did you mean 'Block'\?\), which the model"):
        select_blocks(model, ["Blok"], "trainer.fsdp.wrap")


@pytest.mark.parametrize("overrides, expected", [
    ({}, []),
    ({"activation_checkpointing": True}, ["Block"] * 3),  # the same rule as FSDP's blocks
    ({"activation_checkpointing": ["LayerNorm"]}, ["LayerNorm"] * 7),
    ({"strategy": "fsdp", "fsdp.activation_checkpointing": True}, ["Block"] * 3),  # the FSDP option is an alias
    ({"strategy": "fsdp", "fsdp.wrap": ["Embedding"], "activation_checkpointing": True}, ["Embedding"] * 2),
])
def test_blocks_to_checkpoint(overrides, expected):
    from mgpucli.components.models import CharTransformer

    model = CharTransformer(d_model=16, n_head=2, n_layer=3)
    assert [type(m).__name__ for m in blocks_to_checkpoint(model, trainer(**overrides))] == expected


def test_activation_checkpointing_without_blocks_names_the_classes():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    with pytest.raises(UsageError, match="Linear, ReLU") as info:
        blocks_to_checkpoint(model, trainer(activation_checkpointing=True))
    assert "trainer.activation_checkpointing=[" in info.value.hint


def test_the_fsdp_alias_with_another_strategy_points_to_the_general_option():
    with pytest.raises(UsageError) as info:
        check_combinations(trainer(strategy="ddp", **{"fsdp.activation_checkpointing": True}), rt())
    assert "trainer.activation_checkpointing=true" in info.value.hint
