"""The shipped recipes: where they are, what they need, and turning a recipe argument into a file.

A recipe argument is a path if that file exists (a path always wins), otherwise the name of a shipped
recipe (``quickstart``, ``digits``...). The shipped recipes are the repository's ``recipes/*.yaml``: a built
wheel carries a copy inside the package (``mgpucli/_recipes/``, see ``setup.py``); a source checkout or an
editable install reads ``recipes/`` in the checkout.

Stdlib and PyYAML only: ``mgpu recipes`` lists without importing torch, omegaconf or hydra.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from mgpucli.errors import RecipeError, UsageError

PACKAGED_DIR = Path(__file__).resolve().parent / "_recipes"  # what a wheel ships (setup.py fills it)
CHECKOUT_DIR = Path(__file__).resolve().parent.parent / "recipes"  # a source checkout / editable install
SUFFIXES = (".yaml", ".yml")
# What a recipe's ``requires:`` entry (an importable module) comes with for users: (what they install, what of it it
# is or says, None: nothing more; how to install it). Modules installed by one command are one extra, named once.
# Anything not listed here: the module's own name, and pip install NAME.
KNOWN_REQUIREMENTS = {
    "sklearn": ("the examples extra", "scikit-learn", "pip install 'mgpu[examples]'"),
    "torchvision": ("torchvision", None, "pip install torchvision (the build that matches your torch)"),
    "tensorboard": ("the tensorboard extra", None, "pip install 'mgpu[tensorboard]'"),
    "transformers": ("the hf extra", "Transformers", "pip install 'mgpu[hf]'"),
    "datasets": ("the hf extra", "datasets", "pip install 'mgpu[hf]'"),
    "timm": ("the timm extra", "and a torchvision that matches your torch", "pip install 'mgpu[timm]'"),
}


@dataclass(frozen=True)
class Requirement:
    """A module a recipe needs beyond mgpu's own dependencies."""

    module: str
    installed: bool

    @property
    def _known(self) -> tuple[str, str | None, str]:
        return KNOWN_REQUIREMENTS.get(self.module, (self.module, None, f"pip install {self.module}"))

    @property
    def label(self) -> str:
        """``the hf extra (Transformers)``: what to install, and what of it this module is."""
        extra, what, _ = self._known
        return f"{extra} ({what})" if what else extra

    @property
    def install_hint(self) -> str:
        return self._known[2]


@dataclass(frozen=True)
class Need:
    """One thing a recipe needs installed, as one command installs it: an extra, with the modules it brings."""

    label: str  # the hf extra (Transformers, datasets)
    installed: bool  # every module of it imports here
    install_hint: str


def needs(requires: tuple[Requirement, ...]) -> list[Need]:
    """The recipe's requirements, one per command that installs them, in the recipe's order: Transformers and
    datasets are the hf extra, named once."""
    grouped: dict[tuple[str, str], list[Requirement]] = {}
    for q in requires:
        grouped.setdefault((q._known[0], q.install_hint), []).append(q)
    out = []
    for (extra, hint), group in grouped.items():
        parts = [what for q in group if (what := q._known[1])]
        out.append(Need(f"{extra} ({', '.join(parts)})" if parts else extra, all(q.installed for q in group), hint))
    return out


@dataclass(frozen=True)
class ShippedRecipe:
    name: str
    path: Path
    description: str
    requires: tuple[Requirement, ...]

    @property
    def ready(self) -> bool:
        return all(r.installed for r in self.requires)


def recipes_dir() -> Path:
    """Where the shipped recipes are: inside the installed package, else the checkout's ``recipes/``."""
    if PACKAGED_DIR.is_dir():
        return PACKAGED_DIR
    if CHECKOUT_DIR.is_dir() and (CHECKOUT_DIR.parent / "pyproject.toml").is_file():
        return CHECKOUT_DIR
    raise UsageError(
        f"mgpu's shipped recipes are missing (looked in {PACKAGED_DIR} and {CHECKOUT_DIR}).",
        "This mgpu was built without them: reinstall it from a wheel or sdist built by setup.py, or from a "
        "checkout (pip install -e .).",
    )


def shipped_names() -> list[str]:
    """The names of the shipped recipes, sorted."""
    return sorted(p.stem for p in recipes_dir().iterdir() if p.suffix in SUFFIXES and p.is_file())


def shipped_path(name: str) -> Path | None:
    """The file of the shipped recipe ``name``, or None."""
    for suffix in SUFFIXES:
        path = recipes_dir() / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def _is_installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def describe(name: str) -> ShippedRecipe:
    """Read a shipped recipe's ``description:`` and ``requires:`` (the recipe file is the one source)."""
    import yaml

    path = shipped_path(name)
    if path is None:
        raise unknown_recipe(name)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise RecipeError(str(path), [f"YAML syntax error: {err}"]) from None
    if not isinstance(data, dict):
        raise RecipeError(str(path), ["the recipe must be a YAML mapping at the top level"])
    requires = data.get("requires") or []
    if isinstance(requires, str):
        requires = [requires]
    return ShippedRecipe(
        name=name,
        path=path,
        description=" ".join(str(data.get("description") or "").split()),
        requires=tuple(Requirement(str(m), _is_installed(str(m))) for m in requires),
    )


def catalogue() -> list[ShippedRecipe]:
    """Every shipped recipe, described."""
    return [describe(name) for name in shipped_names()]


def did_you_mean(name: str, names: list[str]) -> str | None:
    """The shipped name a user most likely meant: a unique prefix, else the closest spelling."""
    lowered = name.lower()
    prefixed = [n for n in names if n.lower().startswith(lowered)]
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(lowered, names, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_recipe(name: str) -> UsageError:
    names = shipped_names()
    guess = did_you_mean(name, names)
    return UsageError(
        f"unknown recipe {name!r}: no such file here, and no shipped recipe of that name"
        + (f" (did you mean '{guess}'?)." if guess else "."),
        f"Shipped recipes: {', '.join(names)} (`mgpu recipes` describes them). For your own recipe, pass the "
        f"path of its .yaml file (relative to {Path.cwd()}).",
    )


def looks_like_path(arg: str) -> bool:
    """A separator or a YAML suffix: the user meant a file, not a shipped name."""
    return os.sep in arg or (os.altsep is not None and os.altsep in arg) or arg.endswith(SUFFIXES)


def resolve(arg: str | os.PathLike[str]) -> Path:
    """The recipe file an argument means: an existing file, else a shipped recipe's file (exit 2 if neither).

    An existing file always wins over a shipped name (a directory does not: ``digits/`` holding data must
    not hide the ``digits`` recipe). A missing path-like argument (``conf/r.yaml``) is a RecipeError naming
    the file; a bare word that is no shipped name is reported with the list of names and a did-you-mean.
    """
    text = os.fspath(arg)
    if not text.strip():  # an unset shell variable, usually: Path("") would mean the current directory
        raise UsageError(f"the recipe is {text!r}: empty.", "Pass a recipe .yaml file, or a shipped recipe's name "
                         "(`mgpu recipes` lists them).")
    path = Path(text)
    if path.is_file():
        return path
    if not looks_like_path(text):
        shipped = shipped_path(text)
        if shipped is not None:
            return shipped
        if not path.exists():
            raise unknown_recipe(text)
    if path.exists():
        raise RecipeError(text, [f"{text} is not a file"], "Pass the path of a recipe .yaml file, or a shipped "
                          "recipe's name (`mgpu recipes` lists them).")
    hint = f"Check the path (relative to the current directory {Path.cwd()})."
    stem = path.name.rsplit(".", 1)[0] if path.name.endswith(SUFFIXES) else path.name
    try:
        shipped = shipped_path(stem)
    except UsageError:  # no shipped recipes at all: the path is the only problem worth naming
        shipped = None
    if shipped is not None:
        hint += f" mgpu ships a recipe named '{stem}': pass just the name ({stem}) to use it."
    raise RecipeError(text, [f"recipe file {text} does not exist"], hint)
