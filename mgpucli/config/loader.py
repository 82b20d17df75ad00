"""Load a recipe through hydra-core's Compose API, with overrides in Hydra's grammar.

Hydra composes the YAML (any directory), interpolation and ``key=value`` / ``+key=value`` / ``~key`` overrides.
A plain ``key=value`` becomes Hydra's ``++key=value`` (set or add), as if the line were written in the recipe, so
a user can set a schema key the recipe leaves at its default (``trainer.max_steps=5``) or a component argument
it doesn't mention (``optim.weight_decay=0.01``). A typo is then reported by the check that knows the valid
keys, with a did-you-mean: the schema check for typed sections, the ``_target_`` signature check
(config/targets.py) for components, instead of Hydra's "use +key", which would only add the typo. Free-form
sections (``vars``, ``requires``) keep Hydra's rule: a new key there needs ``+key=value``.
"""

from __future__ import annotations

import difflib
import re
import shutil
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from mgpucli.errors import RecipeError

FREE_FORM = ("vars", "requires")  # no schema and no signature knows their keys


def _free_form(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in FREE_FORM)


def prepare_overrides(overrides: list[str], source: str) -> list[str]:
    """Parse overrides with Hydra's own grammar; raise one RecipeError listing every malformed one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    problems: list[str] = []
    prepared: list[str] = []
    for text in overrides:
        try:
            (parsed,) = parser.parse_overrides([text])
        except OverrideParseException as err:
            first = str(err).splitlines()[1:2] or [str(err)]
            problems.append(
                f"override {text!r} is malformed ({first[0].strip()}); use key=value, +key=value to add a key, "
                "or ~key to remove one"
            )
            continue
        key = parsed.key_or_group
        if not key.strip():
            problems.append(f"override {text!r} names no key; use key=value, +key=value to add a key, or ~key to "
                            "remove one")
            continue
        if parsed.type == OverrideType.CHANGE and parsed.package is None and not _free_form(key):
            prepared.append("++" + text)
        else:
            prepared.append(text)
    if problems:
        raise RecipeError(source, problems)
    return prepared


def _yaml_problem(err: Exception) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    detail = f"{context}: {problem}" if context else problem
    return f"YAML syntax error{where}: {detail}"


_NOTHING_TO_REMOVE = re.compile(r"Could not delete from config\. '([^']+)' does not exist")  # Hydra's, for ~key


def _close_key(key: str, recipe: Path) -> str:
    """`` (did you mean 'trainer.epochs'?)`` from the keys the recipe file sets, or ``""``."""
    import yaml

    def keys(node, prefix: str = ""):
        for name, value in node.items() if isinstance(node, dict) else ():
            yield f"{prefix}{name}"
            yield from keys(value, f"{prefix}{name}.")

    try:
        known = list(keys(yaml.safe_load(recipe.read_text(encoding="utf-8"))))
    except (OSError, yaml.YAMLError):
        return ""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unreadable(recipe: Path) -> str | None:
    """Why ``recipe`` is no recipe file to compose (None when it reads as one): it can't be read, it is empty,
    not UTF-8 text (a binary passed by mistake), or YAML whose top is not a mapping of keys."""
    import yaml

    try:
        raw = recipe.read_bytes()
    except OSError as err:
        return f"{recipe} cannot be read: {err.strerror or err}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return (f"{recipe} is not UTF-8 text (byte 0x{raw[err.start]:02x} at position {err.start}): is it a recipe? "
                "A recipe is a YAML file")
    if not text.strip() or all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines()):
        return f"{recipe} is empty: a recipe needs at least name, model, data and optim"
    try:
        top = yaml.safe_load(text)
    except yaml.YAMLError:
        return None  # Hydra reports the syntax error with its line and column
    if not isinstance(top, dict):
        what = "a list" if isinstance(top, list) else f"a single value ({type(top).__name__})"
        return f"{recipe} holds {what} at the top, not a mapping of keys (name: ..., model: ..., data: ...)"
    return None


def compose_recipe(path: str | Path, overrides: list[str]) -> DictConfig:
    """Compose the recipe (a file, or a shipped recipe's name) with overrides (no schema check yet)."""
    import yaml
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mgpucli.recipes import resolve

    source = str(path)
    recipe = resolve(path)  # an existing file, else a shipped recipe's name (exit 2 if neither)
    problem = unreadable(recipe)
    if problem:
        raise RecipeError(source, [problem], "Pass a recipe .yaml file (see recipes/quickstart.yaml), or a shipped "
                          "recipe's name (`mgpu recipes` lists them).")
    prepared = prepare_overrides(overrides, source)
    tmp = None
    config_dir = recipe.resolve().parent
    if recipe.suffix != ".yaml":  # Hydra only reads *.yaml: compose a copy under that suffix
        tmp = Path(tempfile.mkdtemp(prefix="mgpu-recipe-"))
        shutil.copy(recipe, tmp / (recipe.stem + ".yaml"))
        config_dir = tmp
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None, job_name="mgpu"):
            return compose(config_name=recipe.stem, overrides=prepared)
    except yaml.YAMLError as err:
        raise RecipeError(source, [_yaml_problem(err)]) from None
    except (HydraException, OmegaConfBaseException) as err:
        text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        gone = _NOTHING_TO_REMOVE.search(text)
        if gone:
            text = (f"~{gone[1]}: the recipe has no key {gone[1]} to remove{_close_key(gone[1], recipe)}; fix the "
                    "key, or drop the override")
        raise RecipeError(source, [text]) from None
    finally:
        GlobalHydra.instance().clear()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
