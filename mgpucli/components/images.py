"""Image folders, written as plain recipe YAML (needs torchvision, which ``mgpu[timm]`` brings; it must match the
installed torch).

An image folder is the layout most image data comes in: one subfolder per class (``train/cat/001.png``). Its samples
are ``(image tensor, class id)``: the ``classification`` task trains them with any model that takes an image batch,
a timm model by name among them (:func:`mgpucli.components.timm_models.timm_model`). :func:`shapes_folder` makes a
small one (generated shapes) for the shipped image recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from mgpucli.errors import UsageError

__all__ = ["ImageFolder"]  # the catalogue's (docs/components.md); timm_model is in components/timm_models.py

MEAN = (0.485, 0.456, 0.406)  # ImageNet's: what timm's and torchvision's pretrained weights expect
STD = (0.229, 0.224, 0.225)


def default_transform(image_size: int, train: bool) -> Any:
    """torchvision's usual pair: a random resized crop and flip for training; a resize and centre crop (the 0.875
    crop ratio) for evaluation; then a float tensor normalised with ImageNet's mean and std."""
    import torch
    from torchvision.transforms import v2

    if train:
        steps = [v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip()]
    else:
        steps = [v2.Resize(round(image_size / 0.875), antialias=True), v2.CenterCrop(image_size)]
    return v2.Compose([v2.ToImage(), *steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


class ImageFolder(Dataset):
    """Images in class subfolders of ``root`` (``root/<class>/<image>``, any format Pillow reads), as ``(image,
    class id)``. ``classes`` fixes the classes and their order (default: the subfolders' names, sorted: give it when
    a split may lack a class). ``transform``: any callable from a PIL image (a ``_target_``, e.g.
    ``timm.data.create_transform``), else torchvision's usual training (``train: true``) or evaluation transform at
    ``image_size``."""

    def __init__(self, root: str, train: bool = True, image_size: int = 224, classes: list[str] | None = None,
                 transform: Any = None):
        from torchvision.datasets import ImageFolder as Folders

        folder = Path(root)
        if not folder.is_dir():
            from mgpucli.hub import missing_path_problem

            raise UsageError(missing_path_problem("root", root), "Point root at a folder of class subfolders.")
        found = sorted(p.name for p in folder.iterdir() if p.is_dir())
        chosen = list(classes) if classes else found
        unknown = sorted(set(found) - set(chosen))
        if not found or unknown:
            what = f"holds subfolders not in classes ({', '.join(unknown)})" if unknown else "has no class subfolders"
            raise UsageError(f"{root} {what}.", "An image folder is root/<class>/<image>; list every class in "
                             "classes.")
        self.classes = chosen
        self.folders = Folders(str(folder), transform=transform or default_transform(image_size, train),
                               allow_empty=True)
        index = {name: i for i, name in enumerate(chosen)}
        # torchvision numbers the subfolders found; the ids mgpu trains with follow ``classes``
        self.targets = [index[self.folders.classes[t]] for t in self.folders.targets]
        if not self.targets:
            raise UsageError(f"{root} has class subfolders but no image in them.", "Add images, or fix root.")

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image, _ = self.folders[i]
        return image, self.targets[i]

    def model_problems(self, model: Any) -> list[str]:
        """A model that predicts fewer classes than the folder holds."""
        count = getattr(model, "num_classes", None)
        if isinstance(count, int) and count < len(self.classes):
            return [f"the folder holds {len(self.classes)} classes ({', '.join(self.classes[:8])}"
                    f"{', ...' if len(self.classes) > 8 else ''}), but the model predicts {count}: set the model's "
                    f"num_classes to {len(self.classes)}"]
        return []


SHAPES = ("circle", "square", "triangle")


def shapes_folder(root: str, split: str = "train", per_class: int = 100, size: int = 64, seed: int = 0) -> str:
    """A generated image folder (made once, then reused): ``root/<split>/<shape>/NNN.png``, one subfolder per shape
    (circle, square, triangle) of ``per_class`` PNGs, each a shape of random colour, size and place on a noisy
    background. Returns the split's folder, for :class:`ImageFolder`'s ``root``: the image recipe runs with no
    download."""
    import os
    import random
    import tempfile

    from filelock import FileLock

    target = Path(root) / split
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):  # the job's processes make it once; the others wait and reuse it
        if target.is_dir():
            return str(target)
        made = Path(tempfile.mkdtemp(prefix=f".{split}-", dir=target.parent))
        rng = random.Random(f"{seed}-{split}")
        for shape in SHAPES:
            (made / shape).mkdir()
            for i in range(per_class):
                _draw(shape, size, rng).save(made / shape / f"{i:04d}.png")
        os.replace(made, target)
    return str(target)


def _draw(shape: str, size: int, rng: Any) -> Any:
    from PIL import Image, ImageDraw

    noise = bytes(rng.randrange(60, 120) for _ in range(size * size * 3))
    image = Image.frombytes("RGB", (size, size), noise)
    draw = ImageDraw.Draw(image)
    radius = rng.randrange(size // 6, size // 3)
    x, y = rng.randrange(radius, size - radius), rng.randrange(radius, size - radius)
    colour = tuple(rng.randrange(130, 256) for _ in range(3))
    if shape == "circle":
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=colour)
    elif shape == "square":
        draw.rectangle((x - radius, y - radius, x + radius, y + radius), fill=colour)
    else:
        draw.polygon([(x, y - radius), (x - radius, y + radius), (x + radius, y + radius)], fill=colour)
    return image
