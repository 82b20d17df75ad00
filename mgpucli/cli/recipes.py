"""``mgpu recipes``: list the shipped recipes, ``show`` one, ``copy`` one to edit (torchtune's ls / cp).

Never imports torch, omegaconf or hydra: listing reads the recipe files with PyYAML alone.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import typer

from mgpucli.errors import MgpuError

app = typer.Typer(
    help="The recipes mgpu ships: list them (no command), show one, copy one to edit. Run any by name: "
    "mgpu train quickstart.",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _fail(err: MgpuError) -> None:
    from mgpucli.console import print_error

    print_error(str(err))
    sys.exit(err.exit_code)


@app.callback()
def recipes(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout (and nothing else there)."),
) -> None:
    """List the shipped recipes: name, what it does, what it needs and whether that is installed."""
    if ctx.invoked_subcommand is not None:
        return
    from mgpucli.recipes import catalogue

    try:
        found = catalogue()
    except MgpuError as err:
        _fail(err)
    if as_json:
        print(json.dumps({"recipes": [
            {"name": r.name, "description": r.description, "path": str(r.path), "ready": r.ready,
             "requires": [{"module": q.module, "label": q.label, "installed": q.installed, "install": q.install_hint}
                          for q in r.requires]}
            for r in found]}))
        return
    _render(found)


def _render(found) -> None:
    """A name per line, the description beside it and what it needs under it (plain lines: no table to squash
    in a narrow or redirected terminal). The list is the command's output, on stdout (``mgpu recipes | grep``);
    the line saying where the recipes are and the closing hint are notes, on stderr."""
    from rich.console import Console
    from rich.markup import escape

    from mgpucli.console import err_console

    console, notes = Console(highlight=False, soft_wrap=True), err_console()
    where = found[0].path.parent if found else "none found"
    notes.print(f"mgpu's recipes ({escape(str(where))}):", highlight=False)
    width = max((len(r.name) for r in found), default=0)
    pad = " " * (width + 4)
    for r in found:
        console.print(f"  [bold]{escape(r.name.ljust(width))}[/]  {escape(r.description)}", highlight=False)
        console.print(f"{pad}{needs_line(r.requires)}", highlight=False)
    notes.print("Run one by name: mgpu train quickstart, mgpu launch --cpu --nproc 2 quickstart. "
                "Check one: mgpu train NAME --check. Edit a copy: mgpu recipes copy NAME [DEST] (named after DEST).",
                markup=False, highlight=False)


def needs_line(requires) -> str:
    """``needs: the hf extra (Transformers, datasets), installed`` (rich markup): each extra named once, whatever
    number of its modules the recipe needs (:func:`mgpucli.recipes.needs`)."""
    from rich.markup import escape

    from mgpucli.recipes import needs

    if not requires:
        return "needs: nothing extra"
    parts = [f"{escape(n.label)}, [green]installed[/]" if n.installed
             else f"{escape(n.label)}, [yellow]not installed[/]: {escape(n.install_hint)}" for n in needs(requires)]
    return "needs: " + "; ".join(parts)


@app.command("show")
def show(name: str = typer.Argument(..., help="A shipped recipe's name (see `mgpu recipes`).")) -> None:
    """Print a shipped recipe, comments and all, on stdout (its location on stderr)."""
    from mgpucli.console import err_console
    from mgpucli.recipes import shipped_path, unknown_recipe

    try:
        path = shipped_path(name)
        if path is None:
            raise unknown_recipe(name)
    except MgpuError as err:
        _fail(err)
    err_console().print(f"# {path}", markup=False, highlight=False)
    sys.stdout.write(path.read_text(encoding="utf-8"))
    sys.stdout.flush()


@app.command("copy")
def copy(
    name: str = typer.Argument(..., help="A shipped recipe's name (see `mgpu recipes`)."),
    dest: str | None = typer.Argument(None, help="File or directory to write (default: ./NAME.yaml).",
                                      show_default=False),
    force: bool = typer.Option(False, "--force", help="Overwrite DEST if it exists."),
    new_name: str | None = typer.Option(
        None, "--name", help="The copy's name (its runs go to runs/NAME); default: DEST's file name without .yaml.",
        show_default=False),
) -> None:
    """Write an editable copy of a shipped recipe, named after its file (refuses to overwrite unless --force)."""
    from mgpucli.console import err_console
    from mgpucli.recipe_copy import copy_recipe

    try:
        copied = copy_recipe(name, Path(dest) if dest else None, force=force, name=new_name)
    except MgpuError as err:
        _fail(err)
    target = copied.path
    shown = shlex.quote(str(target) if target.parent != Path(".") else f"./{target}")  # ./x.yaml: a path
    err_console().print(
        f"wrote {target}: a copy of the shipped recipe {name}, named {copied.name} (its runs go to "
        f"{copied.run_dir}). Edit it, then: mgpu train {shown} --check, and mgpu launch ... {shown}.",
        markup=False, highlight=False)
