"""``mgpu launch [options] SCRIPT.py ARGS``: everything after the script is the script's, untouched.

Click parses options wherever they are (``mgpu launch quickstart --resume auto`` must keep working for recipes), so
it would take a script's ``--epochs 10`` or ``--cpu`` for mgpu's own. The command line is therefore split before the
CLI parses it: :func:`split_script_args` walks the tokens after ``launch`` with the arity of each of the command's
own options (read from the command itself, so a new option needs no change here) to the launch target; when that is
a ``.py`` file or ``-m MODULE``, the CLI gets the command line up to the target and the rest is kept aside for the
script. A recipe's command line is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mgpucli.launch.script import is_script

COMMAND = "launch"
MODULE_OPTION = "-m"


def _arity(param: Any) -> int:
    """How many tokens an option takes after its name (0 for a flag or a counter)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return 0
    return int(getattr(param, "nargs", 1) or 1)


def option_arities(command: Any) -> dict[str, int]:
    """Every option name of a click command (``--gpus``, ``--no-x``...) -> the tokens it takes after it."""
    out = {}
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        arity = _arity(param)
        for name in param.opts:
            out[name] = arity
        for name in getattr(param, "secondary_opts", ()):
            out[name] = 0
    return out


def _first_positional(argv: Sequence[str], start: int, arities: dict[str, int]) -> int | None:
    """The index of the first token at or after ``start`` that is not an option or an option's value."""
    i = start
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return i + 1 if i + 1 < len(argv) else None
        if token.startswith("-") and token != "-":
            name, eq, _ = token.partition("=")
            i += 1 if eq else 1 + arities.get(name, 0)  # an unknown option: click will say so
            continue
        return i
    return None


def split_script_args(argv: Sequence[str], group: Any) -> tuple[list[str], tuple[str, ...] | None]:
    """(what the CLI parses, the script's arguments): for ``mgpu launch [options] SCRIPT.py ARGS`` or ``mgpu launch
    [options] -m MODULE ARGS``, the CLI gets the line up to and including the script (or ``-m MODULE``), and ARGS
    are the script's, whatever they look like. Anything else comes back as it is, with None."""
    argv = list(argv)
    at = _first_positional(argv, 0, option_arities(group))
    if at is None or argv[at] != COMMAND:
        return argv, None
    arities = option_arities(group.commands[COMMAND])
    i = at + 1
    while i < len(argv):
        token = argv[i]
        if token == "--":  # the target comes next, whatever it looks like
            target = i + 1
            if target < len(argv) and is_script(argv[target]):
                return argv[: target + 1], tuple(argv[target + 1:])
            return argv, None
        if token == MODULE_OPTION:
            if i + 1 >= len(argv):
                return argv, None  # click reports the missing module name
            return argv[: i + 2], tuple(argv[i + 2:])
        if token.startswith(MODULE_OPTION) and not token.startswith("--"):  # -mMODULE, as python takes it
            return argv[: i + 1], tuple(argv[i + 1:])
        if token.startswith("-") and token != "-":
            name, eq, _ = token.partition("=")
            i += 1 if eq else 1 + arities.get(name, 0)
            continue
        if is_script(token):
            return argv[: i + 1], tuple(argv[i + 1:])
        return argv, None  # a recipe: options may follow it
    return argv, None
