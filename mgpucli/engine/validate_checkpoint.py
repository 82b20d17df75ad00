"""Evaluate a checkpoint: the model and data from the recipe inside it (or ``--recipe``), loaded safely.

Also the Python API's loader (``mgpucli.load_checkpoint``).
"""

from __future__ import annotations

import gc
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mgpucli.config import check_recipe, load_recipe
from mgpucli.config.components import build_component
from mgpucli.config.targets import TOP_COMPONENTS
from mgpucli.config.trust import require_trusted
from mgpucli.engine.checkpoints.files import is_mgpu_checkpoint, read_file
from mgpucli.engine.checkpoints.state import load_model_state
from mgpucli.errors import CheckpointError, RecipeError, UsageError
from mgpucli.run_layout import EXAMPLE_LAST_FULL


@dataclass
class Loaded:
    """A checkpoint ready to use: its model (weights loaded), the recipe, and facts about the file."""

    model: torch.nn.Module
    recipe: DictConfig
    info: dict[str, Any]


WEIGHTS = ("model", "ema")


def read_checkpoint(path: str, weights: str = "model",
                    map_location: str | torch.device = "cpu") -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(weights, info) of a checkpoint file (an mgpu checkpoint or a plain state_dict); (None, info) of a sharded
    checkpoint's directory, whose weights :func:`fill_weights` reads once the model is built (its meta alone is
    read here). ``weights``: the model's own (``model``) or their moving average (``ema``)."""
    if weights not in WEIGHTS:
        raise UsageError(f"weights {weights!r}: choose model or ema.")
    if str(path).strip() and Path(path).is_dir():  # "" would be the current directory: read_file says it is empty
        from mgpucli.engine.checkpoints.sharded_readers import read_meta

        meta = read_meta(path)
        return None, _mgpu_info(meta, path, weights, has_ema="ema" in meta.get("extra", ()), fmt="mgpu-sharded")
    return _state_dict_of(read_file(path, map_location=map_location), path, weights)


def fill_weights(model: torch.nn.Module, state: dict[str, Any] | None, path: str, weights: str = "model") -> None:
    """Load what :func:`read_checkpoint` returned into ``model``, after checking that every key and shape fits."""
    if state is None:
        from mgpucli.engine.checkpoints.sharded_readers import load_weights

        load_weights(model, path, weights)
    else:
        load_model_state(model, state, path)


def _mgpu_info(obj: dict[str, Any], path: str, weights: str, has_ema: bool, fmt: str) -> dict[str, Any]:
    info = {k: obj.get(k) for k in ("step", "world_size")}
    mid = bool(obj.get("mid_epoch"))  # the epoch of its last step, numbered from 1 (see state.epoch_label)
    info.update(epoch=obj.get("epoch", 0) + 1 if mid else obj.get("epoch"), mid_epoch=mid, weights=weights)
    if weights == "ema" and not has_ema:
        raise CheckpointError(f"{path} holds no EMA weights: its run was trained without trainer.ema.",
                              "Use --weights model (the default), or train with trainer.ema={decay: 0.999}.")
    return {**info, "format": fmt, "recipe_text": obj.get("recipe")}


def _state_dict_of(obj: Any, path: str, weights: str = "model") -> tuple[dict[str, Any], dict[str, Any]]:
    """(weights, info) from an mgpu checkpoint or a plain state_dict."""
    if is_mgpu_checkpoint(obj):
        info = _mgpu_info(obj, path, weights, has_ema=obj.get("ema") is not None, fmt="mgpu")
        return obj[weights], info
    if weights == "ema":
        raise CheckpointError(f"{path} is not an mgpu checkpoint, so it holds no EMA weights.",
                              "EMA weights are in checkpoints of runs trained with trainer.ema; use --weights model.")
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, {"format": "state_dict", "epoch": None, "mid_epoch": None, "step": None, "world_size": None,
                     "weights": "model", "recipe_text": None}
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        return _state_dict_of(obj["state_dict"], path)
    raise CheckpointError(
        f"{path} loads, but it is neither an mgpu checkpoint nor a model state_dict (it holds a "
        f"{type(obj).__name__}{' with keys ' + ', '.join(map(str, list(obj)[:5])) if isinstance(obj, dict) else ''}).",
        f"Pass an mgpu checkpoint ({EXAMPLE_LAST_FULL}) or a file saved with torch.save(model.state_dict()).",
    )


def resolve_recipe(info: dict[str, Any], path: str, overrides: list[str], recipe: str | None,
                   trust_recipe: bool) -> DictConfig:
    """The recipe to use: ``--recipe`` (the user's own file) or the checkpoint's, whose every ``_target_``
    must pass the allowlist before anything is imported from outside it or called."""
    if recipe is not None:
        cfg = load_recipe(recipe, overrides)
        check_recipe(cfg, recipe, trackers=None)
        return cfg
    if not info.get("recipe_text"):
        raise UsageError(
            f"{path} is a plain state_dict without a recipe, so mgpu doesn't know the model or the data.",
            "Pass the recipe that builds the model: --recipe recipes/your_recipe.yaml.",
        )
    with tempfile.TemporaryDirectory(prefix="mgpu-ckpt-recipe-") as tmp:
        stored = Path(tmp) / "checkpoint_recipe.yaml"
        stored.write_text(info["recipe_text"])
        try:
            cfg = load_recipe(stored, overrides)
        except RecipeError as err:  # named after the checkpoint, not the temporary file it was composed from
            raise RecipeError(f"stored in {path}", err.problems, err.hint or (
                "Fix the overrides, or give the recipe the checkpoint was trained with: --recipe RECIPE.")) from None
    if not trust_recipe:
        require_trusted(cfg, list(TOP_COMPONENTS), path)
    check_recipe(cfg, f"stored in {path}", trackers=None)
    return cfg


def load_checkpoint(path: str | Path, overrides: list[str] | None = None, *, recipe: str | None = None,
                    trust_recipe: bool = False, map_location: str | torch.device = "cpu",
                    weights: str = "model") -> Loaded:
    """Load a checkpoint's model with its weights (Python API; same safety rules as ``mgpu validate``).

    ``weights_only=True`` loading, the allowlist for the checkpoint's own recipe, key normalisation for
    ``module.``/``_orig_mod.`` prefixes, and a fit check that lists missing, unexpected and mismatched keys.
    ``weights="ema"`` loads the weights' moving average (runs trained with ``trainer.ema``) instead.
    """
    path = str(path)
    state, info = read_checkpoint(path, weights, map_location)
    cfg = resolve_recipe(info, path, list(overrides or []), recipe, trust_recipe)
    torch.manual_seed(int(cfg.seed))
    model = build_component("model", cfg.model, source=path)
    fill_weights(model, state, path, weights)
    model.to(map_location).eval()
    info.pop("recipe_text", None)
    return Loaded(model=model, recipe=cfg, info={"path": path, **info})


def validation_dataset(cfg: DictConfig, split: str, source: str):
    node = OmegaConf.select(cfg, f"data.{split}")
    if node is None:
        raise UsageError(
            f"the recipe of {source} has no data.{split} dataset to evaluate on.",
            f"Give one with an override, e.g. '+data.{split}={{_target_: ...}}' or data.{split}._target_=..., "
            "or choose another --split.",
        )
    return build_component(f"data.{split}", node, source=source)


def run_validation(checkpoint: str, overrides: list[str], *, recipe: str | None, split: str, trust_recipe: bool,
                   env, prefer_cpu: bool = False, weights: str = "model") -> dict[str, Any]:
    """Evaluate ``checkpoint`` on this process (one worker of N when RANK/WORLD_SIZE are set)."""
    from mgpucli.distributed import collectives
    from mgpucli.distributed.runtime import choose_device, setup_process_group, teardown
    from mgpucli.engine.build import build_task_for
    from mgpucli.engine.data import FixedBatches, collate_fn_of
    from mgpucli.engine.evaluate import evaluate_exact
    from mgpucli.engine.run import ensure_cwd_on_path

    ensure_cwd_on_path()
    device = choose_device("cpu" if prefer_cpu else "auto", env)
    state, info = read_checkpoint(checkpoint, weights, device)
    cfg = resolve_recipe(info, checkpoint, overrides, recipe, trust_recipe)
    runtime = setup_process_group(env, cfg.trainer.device, cfg.trainer.timeout_s, cfg.trainer.cpu_threads)
    try:
        torch.manual_seed(int(cfg.seed))
        model = build_component("model", cfg.model, source=checkpoint)
        fill_weights(model, state, checkpoint, weights)
        model.to(runtime.device)
        if cfg.trainer.channels_last:
            model.to(memory_format=torch.channels_last)
        dataset = validation_dataset(cfg, split, checkpoint)
        batch = int(cfg.data.val_batch_size or cfg.data.batch_size)
        batches = FixedBatches(len(dataset), batch, runtime.rank, runtime.world_size)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=batches, num_workers=0,
                                             collate_fn=collate_fn_of(dataset))
        task = build_task_for(cfg, model, checkpoint)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.trainer.precision)
        result = evaluate_exact(model, loader, batches, task, runtime, dtype)
        collectives.barrier(runtime)  # every rank is done with the group before any rank destroys it
    finally:
        model = loader = None
        gc.collect()  # as in engine/run.py: nothing left holding gloo work when the group is destroyed
        teardown()
    info.pop("recipe_text", None)
    samples = result.pop("samples")
    return {"checkpoint": {"path": checkpoint, **info}, "split": split, "samples": samples, "metrics": result,
            "processes": runtime.world_size, "device": str(runtime.device), "threads_per_process": runtime.cpu_threads}
