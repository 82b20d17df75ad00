"""The CLI shell: help and version are instant and never import torch, omegaconf or hydra."""

from __future__ import annotations

import pytest

from mgpucli import __version__
from tests.procs import mgpu


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["train", "--help"], []])
def test_help_without_torch(tmp_path, no_heavy_imports, args):
    r = mgpu(*args, cwd=tmp_path, env=no_heavy_imports, timeout=30)
    assert r.returncode in (0, 2) if not args else r.returncode == 0, r.output  # bare `mgpu` shows help
    assert "must not be imported" not in r.output
    assert "train" in r.output


def test_version_without_torch(tmp_path, no_heavy_imports):
    r = mgpu("--version", cwd=tmp_path, env=no_heavy_imports, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == f"mgpu {__version__}"
