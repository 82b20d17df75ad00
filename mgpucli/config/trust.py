"""The trust check for recipes found inside checkpoints.

A checkpoint's recipe is data from whoever made the file; a ``_target_`` in it is a function mgpu would call.
Before anything is called, each target is resolved and the resolved object's ``__module__`` is checked against
a short allowlist. The object, not the dotted string: ``torch.nn.parallel.distributed.os.system`` spells a
torch path but resolves to ``os.system``.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from mgpucli.config.targets import iter_targets, locate
from mgpucli.errors import UsageError

ALLOWED_MODULES = (
    "mgpucli.components",
    "mgpucli.engine.tasks",
    "torch.nn",
    "torch.optim",
    "torchvision.models",
    "torchvision.datasets",
    "torchvision.transforms",
    # Transformers' model, config and tokenizer classes (their from_pretrained / from_config, the auto classes) and
    # timm's model factory and transforms; never with trust_remote_code (REFUSED_ARGUMENTS)
    "transformers.models",
    "timm.models",
    "timm.data",
)
# Arguments that make an allowed constructor run code from elsewhere: refused wherever they are true.
REFUSED_ARGUMENTS = ("trust_remote_code",)
ALLOWED_ROOTS = tuple(sorted({m.split(".")[0] for m in ALLOWED_MODULES}))


def _allowed(module: str | None) -> bool:
    return bool(module) and any(module == m or module.startswith(m + ".") for m in ALLOWED_MODULES)


def untrusted_targets(node: Any, path: str) -> list[str]:
    """Descriptions of every ``_target_`` under ``node`` that is not on the allowlist."""
    container = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    refused = []
    for where, target_node in iter_targets(container, path):
        target = target_node.get("_target_")
        if not isinstance(target, str) or target.split(".")[0] not in ALLOWED_ROOTS:
            refused.append(f"{where}: {target}")  # not even imported
            continue
        try:
            obj = locate(target)
        except Exception:
            refused.append(f"{where}: {target} (does not import)")
            continue
        module = getattr(obj, "__module__", None)
        if not _allowed(module):
            refused.append(f"{where}: {target} (resolves to {module}.{getattr(obj, '__qualname__', '?')})")
        refused += [f"{where}.{name}: true (runs code the file names)" for name in REFUSED_ARGUMENTS
                    if target_node.get(name) is True]
    return refused


def require_trusted(cfg: DictConfig, paths: list[str], source: str) -> None:
    """Refuse (exit 2) when any target in ``paths`` of ``cfg`` is outside the allowlist."""
    refused: list[str] = []
    for path in paths:
        node = OmegaConf.select(cfg, path)
        if node is not None:
            refused += untrusted_targets(node, path)
    if refused:
        raise UsageError(
            f"the recipe stored in {source} calls code outside mgpu's allowlist ({', '.join(ALLOWED_MODULES)}), "
            "and a checkpoint's recipe is data from whoever made the file. Refused targets:\n  "
            + "\n  ".join(refused),
            "If you trust this file, pass --trust-recipe; or pass your own recipe with --recipe PATH.",
        )
