"""docs/byo.md's "bring your own model and dataset" example, exactly as written there, on 2 CPU processes.

The files and the commands are read from the page, so the page cannot drift from what works.
``PYTHONSAFEPATH=1`` keeps Python itself from putting the working directory on ``sys.path`` (as the ``mgpu``
console script does not either): the user's package is found only because mgpu puts it there, in the launcher
and in every worker.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.procs import REPO, load_ckpt, mgpu

DOC = REPO / "docs" / "byo.md"
SAFE = {"PYTHONSAFEPATH": "1"}


def doc_files() -> dict[str, str]:
    """``**`path`**`` followed by a fenced block: the example's files."""
    pattern = re.compile(r"^\*\*`([^`]+)`\*\*[^\n]*\n\n```[a-z]*\n(.*?)^```$", re.M | re.S)
    return dict(pattern.findall(DOC.read_text(encoding="utf-8")))


def doc_commands() -> list[list[str]]:
    """The ``mgpu ...`` lines of the page's bash block, without their comments."""
    (block,) = re.findall(r"^```bash\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.M | re.S)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("mgpu ")]


@pytest.fixture
def project(tmp_path) -> Path:
    files = doc_files()
    assert set(files) == {"mypkg/__init__.py", "mypkg/data.py", "mypkg/models.py", "spirals.yaml"}
    root = tmp_path / "spirals"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_page_runs_as_written_on_two_cpu_processes(project):
    check, launch, validate = doc_commands()
    assert check == ["mgpu", "train", "spirals.yaml", "--check"]
    assert launch == ["mgpu", "launch", "--cpu", "--nproc", "2", "spirals.yaml"]

    r = mgpu(*check[1:], cwd=project, env=SAFE, timeout=60)
    assert r.returncode == 0, r.output
    shown = re.search(r"^```text\n(ok: recipe spirals.yaml.*?)^```$", DOC.read_text(), re.M | re.S).group(1)
    assert r.stderr.startswith(shown), r.stderr  # the page shows the real output
    assert not (project / "runs").exists()

    r = mgpu(*launch[1:], cwd=project, env=SAFE, timeout=240)
    assert r.returncode == 0, r.output
    ckpt = load_ckpt(project / "runs/spirals/checkpoints/last.pt")
    assert ckpt["world_size"] == 2 and ckpt["epoch"] == 4
    assert ckpt["metrics"]["accuracy"] > 0.85  # the page says about 95%; chance is 50%

    r = mgpu(*validate[1:], "--json", cwd=project, env=SAFE, timeout=120)
    assert r.returncode == 0, r.output
    assert '"samples": 512' in r.stdout


def test_without_mgpu_the_package_is_not_importable_from_the_workers(project):
    # The control for the test above: under PYTHONSAFEPATH, Python alone does not find the package.
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import mypkg"], cwd=project, env={**SAFE, "PATH": "/usr/bin"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "No module named 'mypkg'" in r.stderr


def test_a_package_on_the_python_path_from_another_directory(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recipe = str(project / "spirals.yaml")
    env = {**SAFE, "PYTHONPATH": str(project)}
    r = mgpu("launch", "--cpu", "--nproc", "2", recipe, "trainer.epochs=1", "data.train.num_samples=256",
             cwd=elsewhere, env=env, timeout=240)
    assert r.returncode == 0, r.output
    assert load_ckpt(elsewhere / "runs/spirals/checkpoints/last.pt")["world_size"] == 2
    # Without the path, the same launch is refused before any worker starts: exit 2, the import reason.
    r = mgpu("launch", "--cpu", "--nproc", "2", recipe, "run_dir=other", cwd=elsewhere, env=SAFE, timeout=60)
    assert r.returncode == 2 and "'mypkg.models.Net' does not import" in r.stderr and "Traceback" not in r.output
    assert not (elsewhere / "other").exists()
