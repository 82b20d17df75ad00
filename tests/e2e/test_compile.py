"""End-to-end: `trainer.compile=true` (torch.compile, inductor on CPU) trains, saves clean checkpoints, resumes
and validates like an eager run."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.inproc import cli
from tests.procs import RECIPES, load_ckpt, mgpu

QUICK = str(RECIPES / "quickstart.yaml")
SMALL = ["data.train.num_samples=1024", "data.val.num_samples=301", "trainer.log_every=8"]

# inductor's CPU kernels are C++ it compiles at run time: without a compiler torch.compile cannot work at all
pytestmark = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                                 reason="torch.compile's CPU backend needs a C++ compiler")


def test_compiled_run_trains_like_eager_saves_clean_keys_resumes_and_validates(tmp_path):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # a cold cache: a real compile
    compiled = mgpu("train", QUICK, *SMALL, "trainer.epochs=1", "trainer.compile=true", "run_dir=compiled",
                    cwd=tmp_path, env=env, timeout=300)
    assert compiled.returncode == 0, compiled.output
    assert any((tmp_path / "inductor").rglob("*.py")), "nothing was compiled"
    eager = cli("train", QUICK, *SMALL, "trainer.epochs=1", "run_dir=eager", cwd=tmp_path)  # in this process
    assert eager.returncode == 0, eager.output

    a, b = load_ckpt(tmp_path / "compiled/checkpoints/last.pt"), load_ckpt(tmp_path / "eager/checkpoints/last.pt")
    assert set(a["model"]) == set(b["model"])  # no "_orig_mod." prefixes: the same keys as an eager run
    assert set(a["optimizer"]["state"]) == set(a["model"])
    for key in b["model"]:  # fused kernels may round differently; the training is the same
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5)

    val = [json.loads(x) for x in (tmp_path / "compiled/metrics.jsonl").read_text().splitlines()]
    val = [m for m in val if m["split"] == "val"][-1]
    checked = mgpu("validate", "compiled/checkpoints/last.pt", "--json", cwd=tmp_path, env=env, timeout=300)
    assert checked.returncode == 0, checked.output
    metrics = json.loads(checked.stdout)["metrics"]
    assert metrics["loss"] == pytest.approx(val["loss"], rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(val["accuracy"], abs=1 / 301 / 2)

    resumed = mgpu("train", QUICK, *SMALL, "trainer.epochs=2", "trainer.compile=true", "run_dir=compiled",
                   "--resume", "auto", cwd=tmp_path, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.output
    assert "resumed from" in resumed.stderr
    assert load_ckpt(tmp_path / "compiled/checkpoints/last.pt")["step"] == 64
