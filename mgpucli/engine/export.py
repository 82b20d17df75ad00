"""``mgpu export RUN_DIR OUT_DIR``: a run's checkpoint as a Hugging Face Transformers model directory.

The checkpoint is loaded as ``mgpu validate`` loads it (``weights_only=True``, the allowlist for its recipe; a
sharded checkpoint's weights read from its shards in this process, its optimizer state never read), the model is
built from its recipe with the checkpoint's weights, and written with ``save_pretrained`` (safetensors),
with the tokenizer the recipe's train set uses and, when the dataset names its classes (``labels``), the model's
``id2label``. ``AutoModelFor<head>.from_pretrained(OUT_DIR)`` then gives the checkpoint's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mgpucli.errors import CheckpointError, UsageError
from mgpucli.run_files import checkpoint_dir, saved_checkpoint

WHICH = ("last", "best")


@dataclass
class Exported:
    checkpoint: str
    step: int | None
    out_dir: str
    files: list[str]
    tokenizer: bool
    load_with: str  # the line that loads it: ``transformers.AutoModelFor...from_pretrained('OUT_DIR')``


def checkpoint_of(run_dir: str, which: str) -> Path:
    """The run's ``last`` or ``best`` checkpoint (a file, or a sharded one's directory); exit 2 naming what is there
    instead."""
    if which not in WHICH:
        raise UsageError(f"--checkpoint {which!r}: choose last or best.")
    if not Path(run_dir).is_dir():
        raise UsageError(f"{run_dir} is not a run dir (it does not exist).", "Pass the run dir a run trained into, "
                         "e.g. runs/NAME.")
    found = saved_checkpoint(run_dir, which)
    if found is not None:
        return found
    folder = checkpoint_dir(run_dir)
    held = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
    said = f"its checkpoints: {', '.join(held)}" if held else "no checkpoints at all"
    raise CheckpointError(f"{run_dir} has no {which} checkpoint ({said}).",
                          "Export another one with --checkpoint last|best.")


def _free_out_dir(out_dir: str) -> Path:
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out_dir} exists and is not an empty directory; export writes nothing over files.",
                         "Choose a new OUT_DIR (or empty this one).")
    return out


def _tokenizer_of(cfg: DictConfig) -> Any:
    """The train set's tokenizer (a Hub id, a directory or a ``_target_``), or None when it has none."""
    node = OmegaConf.select(cfg, "data.train.tokenizer")
    if node is None:
        return None
    from mgpucli.components.hf_text import load_tokenizer
    from mgpucli.config.targets import build

    head = str(OmegaConf.select(cfg, "data.train.head", default=""))
    return load_tokenizer(build(node) if isinstance(node, DictConfig) else str(node), head)


def _name_labels(model: Any, cfg: DictConfig) -> None:
    names = OmegaConf.select(cfg, "data.train.labels")
    if names and getattr(model.config, "num_labels", None) == len(names):
        model.config.id2label = dict(enumerate(str(n) for n in names))
        model.config.label2id = {str(n): i for i, n in enumerate(names)}


def export(run_dir: str, out_dir: str, which: str = "last", weights: str = "model",
           trust_recipe: bool = False) -> Exported:
    """Write ``run_dir``'s ``which`` checkpoint to ``out_dir`` as a Transformers model directory."""
    from mgpucli.engine.validate_checkpoint import load_checkpoint

    checkpoint = checkpoint_of(run_dir, which)
    out = _free_out_dir(out_dir)
    loaded = load_checkpoint(checkpoint, trust_recipe=trust_recipe, weights=weights)
    model = loaded.model
    if not callable(getattr(model, "save_pretrained", None)):
        raise UsageError(f"the model of {checkpoint} is a {type(model).__name__}, not a Hugging Face Transformers "
                         "model: export writes Transformers model directories.",
                         "Its weights are in the checkpoint: mgpucli.load_checkpoint(PATH).model.state_dict().")
    _name_labels(model, loaded.recipe)
    tokenizer = _tokenizer_of(loaded.recipe)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    head = OmegaConf.select(loaded.recipe, "model.head")
    from mgpucli.components.hf_models import HEADS

    auto = HEADS.get(str(head), type(model).__name__)
    return Exported(checkpoint=str(checkpoint), step=loaded.info.get("step"), out_dir=str(out),
                    files=sorted(p.name for p in out.iterdir()), tokenizer=tokenizer is not None,
                    load_with=f"transformers.{auto}.from_pretrained({str(out)!r})")
