"""mgpu: single-machine multi-GPU PyTorch training that is correct by default.

Importing this package is cheap: torch, omegaconf and hydra are imported only by the parts that need them,
so ``mgpu --help`` and ``mgpu --version`` never pay for them.

Python API: ``mgpucli.load_checkpoint(path)`` returns the checkpoint's model (weights loaded, eval mode),
its recipe and facts about the file, under the same safety rules as ``mgpu validate``. ``mgpucli.progress(step)``
tells ``mgpu launch`` the step a user's own script reached (a no-op anywhere else), so failures and collective
timeouts name it.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "load_checkpoint", "progress"]


def __getattr__(name: str) -> Any:  # lazy: keep `import mgpucli` free of torch
    if name == "load_checkpoint":
        from mgpucli.engine.validate_checkpoint import load_checkpoint

        return load_checkpoint
    if name == "progress":
        from mgpucli.distributed.step_progress import progress

        return progress
    raise AttributeError(f"module 'mgpucli' has no attribute {name!r}")
