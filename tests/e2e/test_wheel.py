"""From a built wheel in a fresh virtual environment, outside the repository: the recipes travel with mgpu.

The build goes the way a release does: an sdist from a copy of the checkout (so MANIFEST.in must carry
``recipes/``), then a wheel from the unpacked sdist (so ``setup.py``'s hook must copy them into the package),
installed with ``--no-deps`` into a venv that borrows torch and the rest from this environment: nothing is
downloaded. Every command then runs from a directory that holds no recipe, with the checkout off the path.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.procs import RECIPES, REPO, load_ckpt, run

pytestmark = pytest.mark.slow
SHIPPED = sorted(p.name for p in RECIPES.glob("*.yaml"))
SMALL = ["data.train.num_samples=512", "data.val.num_samples=128", "trainer.epochs=1"]
# What the copy of the checkout leaves out: these names at its top only (``mgpucli/distributed`` is a package, not a
# build output), caches anywhere.
TOP_LEVEL_SKIP = {".git", ".venv", "runs", "build", "dist", ".pytest_cache", ".ruff_cache", "tests", "benchmarks"}
CACHES = shutil.ignore_patterns("*.egg-info", "__pycache__")
PACKAGES = sorted(".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "mgpucli").rglob("__init__.py")
                  if "__pycache__" not in p.parts)


def _skip(directory: str, names: list[str]) -> set[str]:
    skipped = set(CACHES(directory, names))
    return skipped | (TOP_LEVEL_SKIP & set(names)) if Path(directory) == REPO else skipped


def _setuptools_problem() -> str | None:
    """None if this environment's setuptools meets pyproject's build-system (the build has no isolation)."""
    import re
    from importlib.metadata import PackageNotFoundError, version

    text = (REPO / "pyproject.toml").read_text()
    need = re.search(r'requires = \[[^\]]*"setuptools>=([\d.]+)"', text)
    minimum = tuple(int(x) for x in need.group(1).split(".")) if need else (0,)
    try:
        have = tuple(int(x) for x in re.findall(r"\d+", version("setuptools"))[:3])
    except PackageNotFoundError:
        have = (0,)
    if have >= minimum:
        return None
    return (f"setuptools>={'.'.join(map(str, minimum))} is needed to build the wheel here, found "
            f"{'.'.join(map(str, have))}: pip install -e '.[dev]'")


def _check(r, what: str) -> None:
    assert r.returncode == 0, f"{what} failed:\n{r.output}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    problem = _setuptools_problem()
    assert problem is None, problem
    work = tmp_path_factory.mktemp("build")
    src = work / "src"
    shutil.copytree(REPO, src, ignore=_skip)
    _check(run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                "print(b.build_sdist(sys.argv[1]))", str(work / "sdist")], cwd=src, timeout=120), "sdist")
    (sdist,) = (work / "sdist").glob("mgpu-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        tar.extractall(work / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    assert {n.split("/", 1)[1] for n in names if "/recipes/" in n} >= {f"recipes/{n}" for n in SHIPPED}
    (unpacked,) = (work / "unpacked").iterdir()
    _check(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                "--no-cache-dir", "-w", str(work / "wheel"), str(unpacked)], cwd=work, timeout=180), "pip wheel")
    (whl,) = (work / "wheel").glob("mgpu-*.whl")
    with zipfile.ZipFile(whl) as zf:
        files = set(zf.namelist())
    packed = {n for n in files if n.startswith("mgpucli/_recipes/")}
    assert packed == {f"mgpucli/_recipes/{n}" for n in SHIPPED}
    missing = [p for p in PACKAGES if p.replace(".", "/") + "/__init__.py" not in files]
    assert not missing, f"packages missing from the wheel: {missing}"
    extra = sorted(n for n in files if n.startswith("mgpucli/") and not n.endswith(".py") and n not in packed)
    assert not extra, f"files in the wheel that are neither modules nor recipes: {extra}"
    return whl


def test_package_data_names_only_files_that_exist():
    """pyproject's package-data (if any) matches real files: the wheel ships modules and recipes (setup.py)."""
    tomllib = pytest.importorskip("tomllib")
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})
    for package, patterns in setuptools_cfg.get("package-data", {}).items():
        for pattern in patterns:
            assert list((REPO / package.replace(".", "/")).glob(pattern)), f"{package}: {pattern} matches no file"


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; torch & co. come from this environment (no downloads)."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    _check(run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)],
               cwd=root.parent, timeout=120), "venv")
    py = root / "bin" / "python"
    if sys.prefix != sys.base_prefix:  # the tests run in a venv themselves: lend it its packages too
        purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=root,
                      timeout=60).stdout.strip()
        Path(purelib, "_mgpu_test_parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _check(run([str(py), "-m", "pip", "install", "--no-deps", "--ignore-installed", "--no-index", "--no-cache-dir",
                str(wheel)], cwd=root, timeout=180), "pip install")
    return root


def in_venv(venv: Path, *args: str, cwd: Path, timeout: float = 120):
    """Run a venv command with the checkout nowhere on the path."""
    env = {"PYTHONPATH": "", "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}  # "" adds nothing
    return run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, env=env, timeout=timeout)


@pytest.fixture
def outside(tmp_path) -> Path:
    assert REPO not in tmp_path.parents
    return tmp_path


def test_mgpu_comes_from_the_wheel_with_its_recipes(venv, outside):
    r = in_venv(venv, "python", "-c", "import mgpucli, mgpucli.recipes as r; print(mgpucli.__file__); "
                "print(r.recipes_dir())", cwd=outside)
    _check(r, "import")
    module, recipes_dir = r.stdout.split()
    assert Path(module).is_relative_to(venv) and Path(recipes_dir).is_relative_to(venv), r.stdout
    assert Path(recipes_dir).name == "_recipes"


def test_every_package_imports_from_the_wheel(venv, outside):
    """Each of mgpucli's packages from the venv itself: an editable install of the checkout in the environment it
    borrows from must not fill in one the wheel lacks (mgpucli.distributed once came from there)."""
    code = ("import importlib, sys\nfor name in sys.argv[1:]:\n    print(importlib.import_module(name).__file__)")
    r = in_venv(venv, "python", "-c", code, *PACKAGES, cwd=outside)
    _check(r, "import every package")
    files = r.stdout.split()
    assert len(files) == len(PACKAGES) and all(Path(f).is_relative_to(venv) for f in files), r.stdout


def test_recipes_lists_shows_and_copies(venv, outside):
    r = in_venv(venv, "mgpu", "recipes", "--json", cwd=outside)
    _check(r, "mgpu recipes --json")
    found = json.loads(r.stdout)["recipes"]
    assert sorted(f"{x['name']}.yaml" for x in found) == SHIPPED
    assert all(Path(x["path"]).is_relative_to(venv) and x["description"] for x in found)
    r = in_venv(venv, "mgpu", "recipes", cwd=outside)
    _check(r, "mgpu recipes")
    assert "quickstart" in r.stdout and "Synthetic 4-class classification" in r.stdout  # the list: stdout
    r = in_venv(venv, "mgpu", "recipes", "show", "digits", cwd=outside)
    assert r.returncode == 0 and r.stdout == (RECIPES / "digits.yaml").read_text(), r.output
    r = in_venv(venv, "mgpu", "recipes", "copy", "quickstart", "mine.yaml", cwd=outside)
    shipped = (RECIPES / "quickstart.yaml").read_text()
    assert r.returncode == 0, r.output
    assert (outside / "mine.yaml").read_text() == shipped.replace("\nname: quickstart\n", "\nname: mine\n", 1)
    r = in_venv(venv, "mgpu", "recipes", "copy", "quickstart", "mine.yaml", cwd=outside)
    assert r.returncode == 2 and "already exists" in r.stderr and "Traceback" not in r.output


def test_train_quickstart_by_name_outside_the_repo(venv, outside):
    r = in_venv(venv, "mgpu", "train", "quickstart", *SMALL, cwd=outside, timeout=180)
    _check(r, "mgpu train quickstart")
    ckpt = load_ckpt(outside / "runs/quickstart/checkpoints/last.pt")
    assert ckpt["epoch"] == 1 and ckpt["world_size"] == 1
    assert "name: quickstart" in (outside / "runs/quickstart/recipe.yaml").read_text()


def test_check_and_launch_by_name_on_two_cpu_processes(venv, outside):
    r = in_venv(venv, "mgpu", "train", "quickstart", "--check", cwd=outside, timeout=120)
    _check(r, "--check")
    assert "ok: shipped recipe quickstart" in r.stderr and str(venv) in r.stderr
    r = in_venv(venv, "mgpu", "launch", "--cpu", "--nproc", "2", "quickstart", *SMALL, cwd=outside, timeout=240)
    _check(r, "mgpu launch")
    assert load_ckpt(outside / "runs/quickstart/checkpoints/last.pt")["world_size"] == 2
    r = in_venv(venv, "mgpu", "train", "quickstrat", cwd=outside, timeout=120)
    assert r.returncode == 2 and "did you mean 'quickstart'?" in r.stderr and "Traceback" not in r.output


def test_pip_left_this_environment_alone(venv):
    # --ignore-installed into the venv: the mgpu of the environment running the tests is still the checkout's.
    r = subprocess.run([sys.executable, "-c", "import mgpucli; print(mgpucli.__file__)"], capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert Path(r.stdout.strip()).is_relative_to(REPO), r.stdout + r.stderr
