"""``mgpu recipes copy NAME [DEST]``: an editable copy of a shipped recipe, named after its file.

A copy that kept ``name: quickstart`` would train into ``runs/quickstart``, the shipped recipe's run dir, and meet
the runs already there. So the copy is named after the file it is written to (``my.yaml`` -> ``name: my``),
or ``--name``. Only the ``name:`` line changes: the file is edited as text, not loaded and dumped as YAML, so
its comments and layout stay as they are.

Stdlib and PyYAML only, like :mod:`mgpucli.recipes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mgpucli.errors import UsageError
from mgpucli.recipes import shipped_path, unknown_recipe

# A run name ends up in a path (runs/<name>): one directory level of plain characters.
VALID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# The top-level ``name:`` line: its value, then an optional comment that is kept.
NAME_LINE = re.compile(r"^name:[ \t]*(?P<value>[^#\n]*?)(?P<comment>[ \t]+#[^\n]*)?[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class CopiedRecipe:
    path: Path  # the file written
    name: str  # its ``name:``
    run_dir: str  # where its runs go


def name_from_file(path: Path, fallback: str) -> str:
    """A run name from a file name: ``my.yaml`` -> ``my``, ``my recipe.yaml`` -> ``my-recipe``."""
    stem = path.name.rsplit(".", 1)[0] if path.suffix in (".yaml", ".yml") else path.name
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.")
    return name if VALID_NAME.fullmatch(name) else fallback


def check_name(name: str) -> None:
    if not VALID_NAME.fullmatch(name):
        raise UsageError(f"--name {name!r}: a recipe name becomes its run dir (runs/<name>), so it must be letters, "
                         "digits, '.', '_' and '-', starting with a letter or a digit.",
                         "Pass another --name, e.g. --name my-run.")


def _yaml_scalar(name: str) -> str:
    """The name as YAML that reads back as this string (``2024`` or ``true`` would read as a number, a bool)."""
    import yaml

    return name if yaml.safe_load(name) == name else f"'{name}'"


def rename(text: str, name: str) -> str:
    """``text`` with its top-level ``name:`` value replaced (its comment kept), or a ``name:`` line added after
    the leading comments when it has none."""
    line = f"name: {_yaml_scalar(name)}"
    found = NAME_LINE.search(text)
    if found:
        return text[:found.start()] + line + (found.group("comment") or "") + text[found.end():]
    lines = text.splitlines(keepends=True)
    at = next((i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#")), len(lines))
    return "".join(lines[:at]) + line + "\n" + "".join(lines[at:])


def _run_dir(text: str, name: str) -> str:
    import yaml

    data = yaml.safe_load(text)
    run_dir = data.get("run_dir") if isinstance(data, dict) else None
    return str(run_dir or "runs/${name}").replace("${name}", name)


def copy_recipe(source_name: str, dest: Path | None = None, force: bool = False,
                name: str | None = None) -> CopiedRecipe:
    """Copy the shipped recipe ``source_name`` to ``dest`` (a file, or a directory to put NAME.yaml in; default
    ``./NAME.yaml``), named ``name`` or after the file written. An existing file is kept unless ``force``."""
    source = shipped_path(source_name)
    if source is None:
        raise unknown_recipe(source_name)
    if name is not None:
        check_name(name)
    target = Path(source.name) if dest is None else dest
    if target.is_dir():
        target = target / source.name
    if target.exists() and not force:
        raise UsageError(f"{target} already exists; not overwriting it.",
                         "Pass --force to overwrite it, or give another destination: "
                         f"mgpu recipes copy {source_name} DEST.")
    if target.exists() and not target.is_file():
        raise UsageError(f"{target} exists and is not a file; not overwriting it.")
    if not target.parent.is_dir():
        blocker = next((p for p in target.parents if p.exists()), None)
        why = (f"{blocker} is a file, not a directory" if blocker is not None and not blocker.is_dir()
               else f"the directory {target.parent} does not exist")
        raise UsageError(f"cannot write {target}: {why}.", "Give a destination in a directory that exists.")
    new_name = name if name is not None else name_from_file(target, source_name)
    text = rename(source.read_text(encoding="utf-8"), new_name)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write {target}: {err.strerror or err}.") from None
    return CopiedRecipe(target, new_name, _run_dir(text, new_name))
