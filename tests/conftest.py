import os
import signal
from pathlib import Path

import pytest

pytest_plugins = ["tests.cost"]  # each test's CPU, the costliest shown at the end of the run


def pytest_configure(config):
    """Ctrl-C as on a terminal, however the suite was started. A shell starts a background job (``cmd &``, a CI
    runner's) with SIGINT ignored; Python then installs no KeyboardInterrupt handler, and every process a test
    starts inherits the ignored signal, so a test of what Ctrl-C does would see nothing happen."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # children start with SIGINT at its default


def pytest_collection_modifyitems(config, items):
    """Skip `gpu`-marked tests where no CUDA device exists (they run on GPU machines)."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _failing_packages(where: Path, names: tuple[str, ...]) -> dict[str, str]:
    """A PYTHONPATH (at ``where``) where importing each of ``names`` fails loudly."""
    for name in names:
        (where / name).mkdir(parents=True)
        (where / name / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    return {"PYTHONPATH": str(where)}


@pytest.fixture
def no_heavy_imports(tmp_path):
    """A PYTHONPATH where importing torch, omegaconf or hydra fails loudly."""
    return _failing_packages(tmp_path / "blocker", ("torch", "omegaconf", "hydra"))


@pytest.fixture
def no_torch(tmp_path):
    """A PYTHONPATH where importing torch fails loudly."""
    return _failing_packages(tmp_path / "torch_blocker", ("torch",))


@pytest.fixture
def blocked_imports(tmp_path, no_heavy_imports):
    """``blocked_imports("mgpucli.launch", ...)``: an environment where importing torch, omegaconf, hydra or any
    of the given modules (and their submodules) fails loudly, also when the import is inside a function."""

    def env(*modules: str) -> dict[str, str]:
        site = tmp_path / "blocked_site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            "import sys\n"
            f"BLOCKED = {modules!r}\n"
            "class _Blocker:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if any(name == m or name.startswith(m + '.') for m in BLOCKED):\n"
            "            raise ImportError(name + ' must not be imported here')\n"
            "sys.meta_path.insert(0, _Blocker())\n")
        return {"PYTHONPATH": os.pathsep.join([str(site), no_heavy_imports["PYTHONPATH"]])}

    return env


# ---------------------------------------------------------------------------------------------- repo guard
REPO = Path(__file__).resolve().parents[1]
# What tests and the tools they run may leave in the checkout: the environment, caches, bytecode, build metadata.
_MAY_CHANGE = {".git", ".venv", ".pytest_cache", ".ruff_cache", "__pycache__", "mgpu.egg-info"}


def _repo_files() -> dict[str, tuple[int, int]]:
    """Every file and folder of the checkout outside _MAY_CHANGE, with its size and modification time."""
    found = {}
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _MAY_CHANGE]
        for name in files + [d + os.sep for d in dirs]:
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            found[os.path.relpath(path, REPO) + (os.sep if name.endswith(os.sep) else "")] = (
                (0, 0) if name.endswith(os.sep) else (st.st_size, st.st_mtime_ns))
    return found


@pytest.fixture(autouse=True)
def _writes_nothing_into_the_repo():
    """Fail a test that creates, changes or deletes a file in the checkout: tests write under tmp_path only."""
    before = _repo_files()
    yield
    after = _repo_files()
    changed = sorted(set(before) ^ set(after) | {p for p in before.keys() & after.keys() if before[p] != after[p]})
    if changed:
        pytest.fail(f"the test wrote into the repository: {', '.join(changed[:10])}", pytrace=False)
