"""The "one place" rules of docs/architecture.md, read from the source: a fact spelled, or a thing done, outside its
home fails here, naming the file and line.

Next to the import rules (``test_import_rules.py``). Docstrings and comments are free to name anything; what counts
is code: string constants (f-string pieces included), names, calls, assignments. Each rule's home, and any module
allowed beside it, is written in the rule's test with the reason.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from mgpucli import env_vars, run_layout

PACKAGE = Path(__file__).resolve().parents[2] / "mgpucli"


class Module:
    """One source file of mgpucli, parsed: its code's strings and the torch names its imports bind."""

    def __init__(self, path: Path):
        self.path = path
        self.name = str(path.relative_to(PACKAGE))
        self.tree = ast.parse(path.read_text(), str(path))
        self.nodes = list(ast.walk(self.tree))
        self.aliases = _torch_aliases(self.nodes)

    def strings(self) -> list[tuple[int, str]]:
        """(line, text) of every string constant that is not a docstring or an option's label in help
        (``metavar="RANK"``)."""
        docs = {id(n.body[0].value) for n in self.nodes
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        docs |= {id(n.value) for n in self.nodes if isinstance(n, ast.keyword) and n.arg == "metavar"}
        return [(n.lineno, n.value) for n in self.nodes
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]

    def dotted(self, node: ast.AST) -> str | None:
        """``torch.distributed.all_reduce`` for ``dist.all_reduce`` (``import torch.distributed as dist``): the torch
        path an expression names, None when it names no torch object."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        return ".".join([self.aliases[node.id], *reversed(attrs)])

    def where(self, line: int, what: str) -> str:
        return f"{self.name}:{line}: {what}"


def _torch_aliases(nodes: list[ast.AST]) -> dict[str, str]:
    aliases = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


@cache
def modules() -> tuple[Module, ...]:
    found = tuple(Module(p) for p in sorted(PACKAGE.rglob("*.py")))
    assert len(found) > 150
    return found


def outside(*homes: str) -> list[Module]:
    """Every module but the homes (paths under mgpucli/; a folder ends with /)."""
    return [m for m in modules() if not any(m.name == h or (h.endswith("/") and m.name.startswith(h)) for h in homes)]


def spelled(pattern: str, *homes: str) -> list[str]:
    """Where a string constant outside the homes matches ``pattern``."""
    regex = re.compile(pattern)
    return [m.where(line, repr(text[:80])) for m in outside(*homes) for line, text in m.strings() if regex.search(text)]


def _calls(module: Module, names: set[str]) -> list[tuple[int, ast.Call]]:
    """Calls of a function or method with one of ``names`` (``f(...)``, ``x.f(...)``)."""
    return [(n.lineno, n) for n in module.nodes if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) in names or getattr(n.func, "attr", None) in names)]


# ------------------------------------------------------------------------------------------------ the role
ROLE_HANDLERS = {
    "distributed/env.py": "reads the process's role (the one place)",
    "audit/session.py": "reads the user's script's role itself (a script's environment may be anything)",
    "faults.py": "test-only fault injection: the rank a fault is armed for",
    "run_records/launch_record.py": "the launcher indexes each worker by the RANK torch's agent gave it",
    "launch/job_source.py": "a Kubernetes pod's WORLD_SIZE and RANK are the node count and the node's rank",
    "doctor/checks_rank.py": "the doctor judges the role variables a user's shell holds",
    "doctor/live.py": "the doctor's live test leaves the shell's role variables out of its launcher's environment",
}


def test_one_place_reads_the_processs_role():
    """``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` are named in ``env_vars.py``; outside it no
    code spells one, and only the modules of :data:`ROLE_HANDLERS` take their names from it."""
    names = "|".join(env_vars.ROLE)
    assert spelled(rf"^({names})$", "env_vars.py") == []
    users = sorted({m.name for m in modules() for n in m.nodes
                    if (isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "env_vars"
                        and n.attr in ("ROLE", *env_vars.ROLE))
                    or (isinstance(n, ast.ImportFrom) and n.module == "mgpucli.env_vars"
                        and {a.name for a in n.names} & {"ROLE", *env_vars.ROLE})})
    assert users == sorted(ROLE_HANDLERS)


# ------------------------------------------------------------------------------------------------ the run dir
def _layout_names() -> tuple[list[str], list[str]]:
    """run_layout's names: (file names, folder names)."""
    values = [v for k, v in vars(run_layout).items() if k.isupper() and not k.startswith("EXAMPLE")
              and isinstance(v, str)]
    return [v for v in values if "." in v.strip(".")], [v for v in values if "." not in v and v.isalpha()]


def test_the_run_dirs_file_names_are_said_only_in_run_layout():
    """Outside ``run_layout.py`` no code string holds a run dir's file name (messages included: they take it from
    there), the checkpoints' suffixes, or the pieces the derived names are built from."""
    files, _ = _layout_names()
    assert "last.dcp" in files and "mlflow.db" in files
    named = "|".join(re.escape(f) for f in files)
    pieces = rf"\.(pt|dcp)\b|^({re.escape(run_layout.LAUNCH_DIR_PREFIX)}|step-)$|\blaunch(\*|\.node)"
    assert spelled(rf"(?<![\w.-])({named})(?!\w)|{pieces}", "run_layout.py") == []


def test_the_run_dirs_folders_are_joined_into_paths_only_from_run_layouts_names():
    """A path into the run dir is built from ``run_layout``'s names: no ``/``, ``os.path.join``, ``joinpath``,
    ``Path`` or ``glob`` outside it takes a run dir name as a literal (the folder names are words that mean other
    things elsewhere, e.g. a tracker's name, so only their use in a path counts)."""
    files, folders = _layout_names()
    assert {"logs", "checkpoints", "tensorboard", "wandb"} <= set(folders)
    found = []
    for m in outside("run_layout.py"):
        pieces = [(n.lineno, p) for n in m.nodes if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                  for p in (n.left, n.right)]
        pieces += [(line, a) for line, call in _calls(m, {"join", "joinpath", "Path", "glob", "rglob"})
                   for a in call.args]
        found += [m.where(line, p.value) for line, p in pieces
                  if isinstance(p, ast.Constant) and p.value in (*files, *folders)]
    assert found == []


# Where a run's last and best checkpoints are named: the lookup, and the checkpoint writers that make them.
CHECKPOINT_HOMES = ("run_files.py", "run_layout.py", "engine/checkpoints/")


def test_one_function_finds_a_runs_checkpoint():
    """``run_files.saved_checkpoint`` is the lookup of a run's newest (and best) checkpoint: outside it (and the
    writers), no path is built from the last or best checkpoint's names, and no code asks where the last one of a
    format goes (``last_checkpoint``)."""
    names = {"LAST_FULL", "LAST_SHARDED", "BEST_FULL", "BEST_SHARDED", "last_name", "best_name", "last_checkpoint"}

    def name_of(node: ast.AST) -> str | None:
        node = node.func if isinstance(node, ast.Call) else node
        return getattr(node, "id", None) or getattr(node, "attr", None)

    found = []
    for m in outside(*CHECKPOINT_HOMES):
        pieces = [(n.lineno, p) for n in m.nodes if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                  for p in (n.left, n.right)]
        pieces += [(line, a) for line, call in _calls(m, {"join", "joinpath", "Path"}) for a in call.args]
        pieces += [(line, call) for line, call in _calls(m, {"last_checkpoint"})]
        found += [m.where(line, name_of(p)) for line, p in pieces if name_of(p) in names]
    assert found == []


# ------------------------------------------------------------------------------------------------ cluster engines
def test_the_cluster_engines_variables_are_read_in_the_job_source():
    """SLURM's, torchrun's ``PET_*`` and Kubernetes' variables are spelled in ``launch/job_source.py`` and
    ``launch/slurm.py`` (the prefixes other layers filter by in ``env_vars.py``); outside them no code names one."""
    assert spelled(r"^(SLURM_|PET_|KUBERNETES_)\w*$", "launch/job_source.py", "launch/slurm.py", "env_vars.py") == []


# ------------------------------------------------------------------------------------------------ processes, stores
def test_proc_is_read_in_one_module():
    assert spelled(r"/proc\b", "procfs.py") == []


def test_one_helper_makes_every_store_client():
    """Clients of a rendezvous store come from ``distributed/store_client.py``. ``launch/rendezvous_watch.py`` makes
    the job's store itself for a static rendezvous of several nodes (node 0 hosts it, the others join it, as torch's
    static rendezvous does)."""
    homes = ("distributed/store_client.py", "launch/rendezvous_watch.py")
    found = [m.where(line, "TCPStore(...)") for m in outside(*homes) for line, _ in _calls(m, {"TCPStore"})]
    assert found == []


def test_one_place_owns_the_process_group():
    """``distributed/runtime.py`` makes and destroys mgpu's process group (``doctor/live_worker.py`` makes a group
    to test the collectives)."""
    calls = {"init_process_group", "destroy_process_group", "new_group"}
    found = [m.where(line, call.func.attr) for m in outside("distributed/runtime.py", "doctor/live_worker.py")
             for line, call in _calls(m, calls) if isinstance(call.func, ast.Attribute)]
    assert found == []


def test_one_place_writes_and_reads_checkpoint_files():
    """``torch.save``/``torch.load`` in ``engine/checkpoints/files.py``; the shards' ``torch.distributed.checkpoint``
    save and load in ``engine/checkpoints/sharded.py``."""
    homes = {"torch.save": "engine/checkpoints/files.py", "torch.load": "engine/checkpoints/files.py",
             "torch.distributed.checkpoint.save": "engine/checkpoints/sharded.py",
             "torch.distributed.checkpoint.load": "engine/checkpoints/sharded.py"}
    found = [m.where(n.lineno, m.dotted(n.func)) for m in modules() for n in m.nodes if isinstance(n, ast.Call)
             and m.dotted(n.func) in homes and homes[m.dotted(n.func)] != m.name]
    assert found == []


# ------------------------------------------------------------------------------------------------ torch
def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def test_nothing_outside_torch_parts_reaches_into_torch():
    """No ``torch._*`` name, private attribute of a torch object, private torch module or class named by a string,
    and no private attribute looked up by name, outside ``torch_parts.py``."""
    found = []
    for m in outside("torch_parts.py"):
        for n in m.nodes:
            path = m.dotted(n) if isinstance(n, ast.Attribute) else None
            if path is not None and any(map(_private, path.split("."))):
                found.append(m.where(n.lineno, path))
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                named = [f"{getattr(n, 'module', None) or ''}.{a.name}".lstrip(".") for a in n.names]
                found += [m.where(n.lineno, x) for x in named if x.startswith("torch") and any(map(_private,
                                                                                                   x.split(".")))]
        found += [m.where(line, "getattr-style lookup of " + call.args[1].value)
                  for line, call in _calls(m, {"getattr", "hasattr", "setattr"}) if len(call.args) > 1
                  and isinstance(call.args[1], ast.Constant) and _private(str(call.args[1].value))
                  and not str(call.args[1].value).startswith("_mgpu")]
    found += spelled(r"\btorch(\.\w+)*\._(?!_)", "torch_parts.py")
    assert found == []


def test_torchruns_own_functions_are_called_only_through_torch_parts():
    """``torch.distributed.run`` (the ``torchrun`` command's module) documents none of its functions: only
    ``torch_parts.py`` imports it. Starting ``python -m torch.distributed.run`` is the documented command."""
    found = [m.where(n.lineno, "import torch.distributed.run") for m in outside("torch_parts.py") for n in m.nodes
             if (isinstance(n, ast.Import) and any(a.name.startswith("torch.distributed.run") for a in n.names))
             or (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("torch.distributed.run"))
             or (isinstance(n, ast.ImportFrom) and n.module == "torch.distributed"
                 and any(a.name == "run" for a in n.names))]
    assert found == []


def test_torch_functions_are_replaced_only_through_torch_parts():
    """No assignment to, ``setattr`` or ``delattr`` on a torch object outside ``torch_parts.py``: every runtime
    replacement goes through ``torch_parts.replace``, and is listed in ``torch_parts.REPLACED`` with its reason."""
    found = []
    for m in outside("torch_parts.py"):
        targets = [t for n in m.nodes if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete))
                   for t in (n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target])]
        found += [m.where(t.lineno, m.dotted(t)) for t in targets
                  if isinstance(t, ast.Attribute) and m.dotted(t) is not None]
        found += [m.where(line, f"{call.func.id}({m.dotted(call.args[0])}, ...)")
                  for line, call in _calls(m, {"setattr", "delattr"})
                  if isinstance(call.func, ast.Name) and call.args and m.dotted(call.args[0]) is not None]
    assert found == []
