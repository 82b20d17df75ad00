"""Script mode, the launcher's side: ``mgpu launch [options] SCRIPT.py [args]`` or ``-m MODULE [args]`` (stdlib only).

A user's own training script gets everything the launcher gives a recipe (the plan, the records, the failure
summary, the post-mortem); what differs is known here, before any worker starts:

- the target (:class:`ScriptTarget`): a file or a module, its arguments, untouched, and whether every worker also
  gets the legacy ``--local_rank=N``;
- that it exists (:func:`check_target`: a missing file or a module ``python -m`` would not find is exit 2), found
  without running any of the user's code in the launcher;
- which spelling of the legacy option the script declares (:func:`declared_local_rank_flag`), read from its
  source text, never imported;
- the run dir a launch gets when none is given (:func:`default_run_dir`): a new one per launch.

The worker's side, which runs the script, is :mod:`mgpucli.launch.script_job`.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.machinery import PathFinder

from mgpucli.errors import UsageError

SCRIPT_JOB = "script"  # the worker's job name (mgpucli.launch.worker.JOBS)
LOCAL_RANK_FLAGS = ("--local-rank", "--local_rank")  # torch.distributed.launch's spelling first (torch >= 2.0)
RUNS_ROOT = "runs"


def is_script(target: str) -> bool:
    """A launch target that is a Python file (everything else is a recipe)."""
    return target.endswith(".py")


@dataclass(frozen=True)
class ScriptTarget:
    """What every worker runs: ``path`` (as ``python PATH ARGS`` would) or ``module`` (as ``python -m MODULE ARGS``),
    with ``args`` untouched; ``local_rank_flag`` (``--local_rank`` or ``--local-rank``): each worker also gets
    ``FLAG=LOCAL_RANK`` before its arguments, as ``python -m torch.distributed.launch`` passed it."""

    path: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    local_rank_flag: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.module is None):
            raise ValueError("a script target is a path or a module, exactly one of them")

    @property
    def name(self) -> str:
        """A short name for the run dir: the file's stem, or the module's last part."""
        if self.module is not None:
            return self.module.rsplit(".", 1)[-1] or "module"
        return os.path.splitext(os.path.basename(self.path or ""))[0] or "script"

    @property
    def shown(self) -> str:
        return f"-m {self.module}" if self.module is not None else str(self.path)

    def words(self) -> list[str]:
        """The target and its arguments as ``python``/``torchrun`` take them: ``main.py ARGS`` or ``-m MOD ARGS``."""
        head = ["-m", self.module] if self.module is not None else [str(self.path)]
        return [*head, *self.args]

    def worker_args(self) -> list[str]:
        """``script [--local-rank-flag FLAG] (PATH | -m MODULE) [ARGS...]``: the worker's job (script_job.parse)."""
        flag = ["--local-rank-flag", self.local_rank_flag] if self.local_rank_flag else []
        return [SCRIPT_JOB, *flag, *self.words()]

    def argv(self, local_rank: str | None) -> list[str]:
        """The script's own arguments in a worker: the legacy ``FLAG=N`` first (where the launcher put it), then
        the user's."""
        if self.local_rank_flag and local_rank is not None:
            return [f"{self.local_rank_flag}={local_rank}", *self.args]
        return list(self.args)


# ------------------------------------------------------------------------------------------ finding it
def check_target(target: ScriptTarget, cwd: str | None = None) -> str:
    """The script's source file (UsageError, exit 2, when there is none to run), found as ``python`` would:
    a path relative to ``cwd``, a module on ``[cwd, *sys.path]`` (``python -m`` puts the working directory first)."""
    here = cwd or os.getcwd()
    if target.path is not None:
        path = os.path.join(here, target.path)
        if os.path.isfile(path):
            return path
        why = "is a directory" if os.path.isdir(path) else "does not exist"
        raise UsageError(f"script {target.path} {why} (looked in {here}).",
                         "Give the path of your training script (a .py file), relative to this directory or "
                         "absolute; mgpu's options go before it, the script's own arguments after it.")
    return find_module(str(target.module), [here, *(p for p in sys.path if p)])


def find_module(name: str, search_path: Sequence[str]) -> str:
    """The file ``python -m NAME`` would run, found on ``search_path`` without importing (so without running)
    any of the user's packages: a package's ``__main__``. UsageError when there is none."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UsageError(f"-m {name}: not a module name.", "Give a dotted module name, as for python -m: "
                         "-m mypkg.train (the script itself: give its path, main.py).")
    locations: list[str] | None = list(search_path)
    for depth, part in enumerate(parts):
        spec = PathFinder.find_spec(part, locations) if locations is not None else None
        if spec is None:
            missing = ".".join(parts[: depth + 1])
            raise UsageError(f"-m {name}: no module named {missing!r} (looked in {search_path[0]} and on sys.path).",
                             "Run mgpu launch from the directory that holds the package (as you would run "
                             "python -m), or install the package; mgpu's options go before -m.")
        locations = list(spec.submodule_search_locations) if spec.submodule_search_locations is not None else None
    if spec.submodule_search_locations is not None:  # a package: python -m runs its __main__
        main = PathFinder.find_spec("__main__", list(spec.submodule_search_locations))
        if main is None or not main.origin:
            raise UsageError(f"-m {name}: {name!r} is a package and has no __main__.py, so python -m cannot run it.",
                             f"Name the module inside it that trains (-m {name}.train), or add {name}/__main__.py.")
        return main.origin
    if not spec.origin or not os.path.isfile(spec.origin):
        raise UsageError(f"-m {name}: not a module python -m can run from a file.", "Give a module of your own.")
    return spec.origin


# ------------------------------------------------------------------------------------------ --local-rank-arg
def declared_local_rank_flag(source: str) -> str | None:
    """The spelling of the legacy option the script's source text declares (a quoted ``--local_rank`` or
    ``--local-rank``), or None. Both declared: ``--local-rank``, which is what torch's launcher passes."""
    for flag in LOCAL_RANK_FLAGS:
        if re.search(rf"""['"]{re.escape(flag)}['"]""", source):
            return flag
    return None


def local_rank_flag(source_path: str) -> tuple[str, str]:
    """(the spelling to pass, a note for the banner) for ``--local-rank-arg``, read from the script's source."""
    try:
        with open(source_path, encoding="utf-8", errors="replace") as fh:
            source = fh.read()
    except OSError:
        source = ""
    name = os.path.basename(source_path)
    flag = declared_local_rank_flag(source)
    unshown = " (torchrun cannot pass it: the torchrun equivalent leaves it out)"
    if flag is not None:
        return flag, f"--local-rank-arg: {name} declares {flag}; each worker gets {flag}=LOCAL_RANK first{unshown}."
    return LOCAL_RANK_FLAGS[0], (f"--local-rank-arg: {name} spells out neither --local_rank nor --local-rank; each "
                                 f"worker gets {LOCAL_RANK_FLAGS[0]}=LOCAL_RANK first, torch.distributed.launch's "
                                 f"spelling{unshown}.")


# ------------------------------------------------------------------------------------------ its run dir
def default_run_dir(name: str, nnodes: int, rdzv_id: str, *, claim: bool, root: str = RUNS_ROOT,
                    now: Callable[[], float] = time.time) -> str:
    """A new run dir for this launch: ``runs/<name>-<YYYYmmdd-HHMMSS>``, suffixed ``-2``, ``-3``... when taken, so a
    launch never writes into another's. On several nodes every node must name the same one without talking to the
    others: ``runs/<name>-<rendezvous id>`` (the id they share). ``claim``: create it now (a real launch: two
    launches in the same second cannot both take it); else only name it (``--dry-run``)."""
    if nnodes > 1:
        return os.path.join(root, f"{name}-{rdzv_id}")
    base = os.path.join(root, f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now()))}")
    for number in range(1, 1000):
        candidate = base if number == 1 else f"{base}-{number}"
        if not claim:
            if not os.path.exists(candidate):
                return candidate
            continue
        try:
            os.makedirs(root, exist_ok=True)
            os.mkdir(candidate)
        except FileExistsError:
            continue
        except OSError as err:
            raise UsageError(f"cannot create run dir {candidate}: {err.strerror or err}.",
                             "Choose another location with --run-dir DIR (or fix the path/permissions).") from None
        return candidate
    raise UsageError(f"every run dir name {base}[-N] is taken.", "Give one with --run-dir DIR.")
