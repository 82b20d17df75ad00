"""A launcher's checked recipe, handed to its workers so that they skip composing it again.

``mgpu launch`` composes the recipe once and checks it while its workers start (they wait for its verdict before
they train: mgpucli/launch/gate.py); each worker then trains the same recipe with the same overrides. Composing it
again there (Hydra's compose, the schema merge, the ``_target_`` checks) would add a few tenths of a second to every
worker's time to first step. So the launcher writes the composed recipe to a file before its workers start and
names it in ``MGPU_CHECKED_RECIPE``; a worker takes it only when its
fingerprint (the recipe file's bytes and the overrides) matches the worker's own arguments, and composes as usual
otherwise (plain ``torchrun ... mgpu train``, a recipe edited since, other overrides, an unreadable file).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mgpucli.run_records.json_files import read_json_object, write_json

ENV = "MGPU_CHECKED_RECIPE"


def fingerprint(recipe: str, overrides: list[str]) -> str:
    """Identifies this recipe + overrides on every node: the bytes of the file the argument means (a path, or a
    shipped recipe's name), not the argument itself, which may differ between nodes (``quickstart`` here,
    ``recipes/quickstart.yaml`` there)."""
    from mgpucli.errors import MgpuError
    from mgpucli.recipes import resolve

    try:
        with open(resolve(recipe), "rb") as fh:
            content = fh.read()
    except (OSError, MgpuError):  # no such recipe: launching fails on it anyway, with its own message
        content = recipe.encode()
    return hashlib.sha1(content + b"\0" + "\0".join(overrides).encode()).hexdigest()


def write(cfg: DictConfig, recipe: str, overrides: list[str], directory: str | Path) -> Path:
    """Write the composed recipe for the workers (atomically); returns the path to put in ``MGPU_CHECKED_RECIPE``."""
    mark = fingerprint(recipe, overrides)
    path = Path(directory) / f"checked-recipe-{mark[:16]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(str(path), {"fingerprint": mark, "recipe": OmegaConf.to_container(cfg)})
    return path


def read(recipe: str, overrides: list[str]) -> DictConfig | None:
    """The launcher's checked recipe when it is this recipe with these overrides, else None (compose it)."""
    path = os.environ.get(ENV)
    if not path:
        return None
    data = read_json_object(path)
    if data is None or data.get("fingerprint") != fingerprint(recipe, overrides):
        return None
    return OmegaConf.create(data["recipe"])
