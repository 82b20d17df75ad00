"""Datasets the shipped recipes use. None downloads anything: the data is made here or shipped by a package."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from mgpucli.components.text import VOCAB_SIZE, corpus, encode

_SPLIT_OFFSET = {"train": 0, "val": 1, "test": 2}


def _check_split(split: str) -> str:
    if split not in _SPLIT_OFFSET:
        raise ValueError(f"split must be one of {', '.join(_SPLIT_OFFSET)}, got {split!r}")
    return split


def _split_seed(seed: int, split: str) -> int:
    return seed * 1000 + _SPLIT_OFFSET[_check_split(split)]


class SyntheticClassification(Dataset):
    """Learnable synthetic classification: Gaussian clusters around per-class centres (no extras needed).

    The class centres depend on ``seed`` only, so the train and val splits share them; the samples of each
    split come from their own generator. Chance accuracy is ``1 / num_classes``.
    """

    def __init__(
        self,
        num_samples: int = 4096,
        num_features: int = 32,
        num_classes: int = 4,
        noise: float = 2.0,
        seed: int = 0,
        split: str = "train",
    ):
        centres = torch.randn(num_classes, num_features, generator=torch.Generator().manual_seed(seed))
        gen = torch.Generator().manual_seed(_split_seed(seed, split))
        self.targets = torch.randint(num_classes, (num_samples,), generator=gen)
        self.inputs = centres[self.targets] + noise * torch.randn(num_samples, num_features, generator=gen)
        self.num_features, self.num_classes = num_features, num_classes

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]


class Digits(Dataset):
    """scikit-learn's handwritten digits (8x8 images, 10 classes, 1,797 samples; shipped with the package).

    Split deterministically by ``seed``: ``val_fraction`` of the samples form the ``val`` split. Pixels are
    scaled to [0, 1]. ``flatten: false`` gives 1x8x8 images for a CNN. Needs the ``examples`` extra.
    """

    def __init__(self, split: str = "train", val_fraction: float = 0.2, seed: int = 0, flatten: bool = True):
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise ImportError(
                "the digits dataset needs scikit-learn: pip install 'mgpu[examples]' (or pip install scikit-learn)"
            ) from None
        data = load_digits()
        x = torch.tensor(data.data, dtype=torch.float32) / 16.0
        y = torch.tensor(data.target, dtype=torch.long)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        n_val = int(round(len(y) * val_fraction))
        _check_split(split)
        idx = order[:n_val] if split == "val" else order[n_val:]
        self.inputs = x[idx] if flatten else x[idx].view(-1, 1, 8, 8)
        self.targets = y[idx]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]


class CharText(Dataset):
    """Character-level language modelling windows over a text (default: mgpu's generated corpus).

    Each sample is ``block_size`` characters and the same window shifted by one as targets. The last
    ``val_fraction`` of the text is the ``val`` split. Characters outside printable ASCII map to '?'.
    """

    vocab_size = VOCAB_SIZE

    def __init__(self, split: str = "train", block_size: int = 64, path: str | None = None,
                 val_fraction: float = 0.1, num_chars: int = 200_000):
        text = Path(path).read_text(encoding="utf-8") if path else corpus(num_chars)
        cut = int(len(text) * (1 - val_fraction))
        _check_split(split)
        part = text[:cut] if split == "train" else text[cut:]
        self.ids = torch.tensor(encode(part), dtype=torch.long)
        self.block_size = block_size
        if len(self.ids) <= block_size:
            raise ValueError(f"the {split} text has {len(self.ids)} characters, fewer than block_size+1")

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.block_size
        chunk = self.ids[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]
