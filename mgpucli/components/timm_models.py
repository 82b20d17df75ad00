"""timm models by name, written as plain recipe YAML (needs ``mgpu[timm]``: timm and a torchvision that matches the
installed torch)."""

from __future__ import annotations

import difflib
from typing import Any

from mgpucli.errors import UsageError

__all__ = ["timm_model"]


def timm_model(name: str, num_classes: int, pretrained: bool = False, **options: Any) -> Any:
    """A timm model by ``name`` (``timm.create_model``: resnet50, vit_small_patch16_224, convnext_tiny...) with a
    head of ``num_classes``; ``pretrained: true`` loads timm's weights (from the Hub cache, or downloaded once per
    machine). ``options`` go to ``create_model`` (``drop_rate``, ``in_chans``...)."""
    import timm

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UsageError(f"'{name}' is not a timm model{hint}.", "List them with python -c \"import timm; "
                         "print(timm.list_models('*resnet*'))\".")
    return timm.create_model(name, pretrained=pretrained, num_classes=num_classes, **options)
