"""Recipes: load YAML through Hydra, apply overrides, check against the schema, instantiate components.

omegaconf and hydra are imported here; the CLI imports this package only inside commands.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from mgpucli.config.loader import compose_recipe
from mgpucli.config.schema_check import validate_recipe
from mgpucli.config.targets import check_recipe


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> DictConfig:
    """Compose, override and validate a recipe; every problem is reported together in one RecipeError."""
    raw = compose_recipe(path, list(overrides or []))
    return validate_recipe(raw, str(path))


__all__ = ["load_recipe", "check_recipe", "compose_recipe", "validate_recipe"]
