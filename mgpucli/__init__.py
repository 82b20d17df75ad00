"""mgpu: single-machine multi-GPU PyTorch training that is correct by default.

Importing this package is cheap: torch, omegaconf and hydra are imported only by the parts that need them,
so ``mgpu --help`` and ``mgpu --version`` never pay for them.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
