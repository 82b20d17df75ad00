"""The layers' import rules, read from the source (every import, also those inside functions)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mgpucli"


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute names (mgpucli uses no relative imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def sources(*packages: str) -> list[Path]:
    return sorted(p for name in packages for p in (PACKAGE / name).rglob("*.py"))


def offenders(files: list[Path], forbidden: str) -> dict[str, list[str]]:
    out = {}
    for path in files:
        bad = sorted(m for m in imports_of(path) if m == forbidden or m.startswith(forbidden + "."))
        if bad:
            out[str(path.relative_to(PACKAGE.parent))] = bad
    return out


def test_the_post_mortem_reads_run_records_and_never_imports_the_launcher():
    assert offenders(sources("postmortem"), "mgpucli.launch") == {}


def test_config_imports_no_engine_module():
    """Recipes know nothing of training: what the pre-flight check needs of the engine is in mgpucli/model_facts.py."""
    assert offenders(sources("config"), "mgpucli.engine") == {}
    assert offenders([PACKAGE / "model_facts.py"], "mgpucli.engine") == {}


def test_run_records_need_only_the_standard_library_and_mgpus_errors():
    allowed = ("mgpucli.errors", "mgpucli.run_layout", "mgpucli.env_vars", "mgpucli.run_records")
    for path in sources("run_records"):
        for name in imports_of(path):
            assert name.split(".")[0] in sys.stdlib_module_names or name.startswith(allowed), (path.name, name)


def test_nothing_below_the_cli_imports_it():
    """Only the ``mgpu`` entry point imports the CLI: a launched worker runs the engine directly, so the launcher,
    the engine and everything else never call up into the command line (typer, rich)."""
    below = [p for p in PACKAGE.rglob("*.py") if "cli" not in p.relative_to(PACKAGE).parts[:1]
             and p.name != "__main__.py"]
    assert len(below) > 50 and offenders(below, "mgpucli.cli") == {}


def test_only_a_script_worker_with_audit_imports_the_audit_and_arming_it_imports_nothing_heavy():
    """``mgpu launch --audit`` is the one way in: the script job imports ``mgpucli.audit`` (inside its ``run``, only
    when asked), and the package itself imports only the standard library until the script imports torch."""
    outside = [p for p in PACKAGE.rglob("*.py") if "audit" not in p.relative_to(PACKAGE).parts[:1]
               and p.name != "script_job.py"]
    assert offenders(outside, "mgpucli.audit") == {}
    top = ast.parse((PACKAGE / "launch" / "script_job.py").read_text())
    assert not [n for n in top.body if isinstance(n, (ast.Import, ast.ImportFrom))
                and "audit" in ast.dump(n)]  # not at module top
    for name in imports_of(PACKAGE / "audit" / "__init__.py"):
        assert name.split(".")[0] in sys.stdlib_module_names or name.startswith(("mgpucli.audit",
                                                                                  "mgpucli.torch_import")), name


def test_the_job_source_is_standard_library_only():
    """``mgpu doctor`` reads the job's engine with the launcher's own reader, and the doctor never imports torch."""
    allowed = ("mgpucli.errors", "mgpucli.env_vars", "mgpucli.launch.slurm", "mgpucli.launch.node_range")
    for path in (PACKAGE / "launch" / "job_source.py", PACKAGE / "launch" / "slurm.py",
                 PACKAGE / "launch" / "node_range.py"):
        for name in imports_of(path):
            assert name.split(".")[0] in sys.stdlib_module_names or name.startswith(allowed), (path.name, name)


def test_the_run_dirs_names_and_the_env_var_names_import_nothing_but_the_standard_library():
    for name in ("run_layout.py", "env_vars.py"):
        assert all(m.split(".")[0] in sys.stdlib_module_names for m in imports_of(PACKAGE / name)), name


def test_the_unit_tests_start_no_process():
    """``tests/unit`` is pure logic (docs/architecture.md): none of its modules imports what starts a process
    (``subprocess``, ``multiprocessing``, the e2e helpers that run the CLI) or calls ``os.fork``/``Popen``; a test that
    needs a real process lives in ``tests/e2e``."""
    starters = {"subprocess", "multiprocessing", "tests.procs.mgpu", "tests.procs.torchrun",
                "mgpucli.proctree.start"}
    found = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        calls = {getattr(n.func, "attr", None) or getattr(n.func, "id", None)
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}
        bad = sorted({m for m in imports_of(path) if m in starters or m.startswith("subprocess.")}
                     | (calls & {"fork", "Popen", "Process", "spawn", "start_processes"}))
        if bad:
            found[path.name] = bad
    assert found == {}
