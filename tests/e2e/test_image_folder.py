"""End-to-end: an image folder of generated PNGs and a timm model by name (fresh weights), on 2 processes, with
exact validation, and its bad input refused at --check.

timm needs a torchvision built for the installed torch, and the CPU torch the suite installs has none (README,
"Tested versions"): these tests run in the torch 2.14.1 + torchvision environment of the README's check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.procs import assert_usage_error, mgpu

pytest.importorskip("timm", reason="timm needs a torchvision that matches torch: see the README's 2.14.1 check")


def recipe_args(folder: Path) -> list[str]:
    return ["image-folder-timm", f"data.train.root.root={folder}", f"data.val.root.root={folder}",
            "data.train.root.per_class=16", "data.val.root.per_class=8", "vars.image_size=32", "trainer.epochs=2",
            "data.batch_size=8", "trainer.cpu_threads=1", "trainer.log_every=2"]


def test_an_image_folder_trains_a_timm_model_and_validates_exactly(tmp_path):
    args = recipe_args(tmp_path / "shapes")
    r = mgpu("launch", "--cpu", "--nproc", "2", *args, "run_dir=img", cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.output
    assert sorted(p.name for p in (tmp_path / "shapes/train").iterdir()) == ["circle", "square", "triangle"]
    assert len(list((tmp_path / "shapes/train/circle").glob("*.png"))) == 16
    records = [json.loads(line) for line in (tmp_path / "img/metrics.jsonl").read_text().splitlines()]
    val = [m for m in records if m["split"] == "val"][-1]
    assert val["samples"] == 24
    runs = [mgpu("validate", "img/checkpoints/last.pt", "trainer.cpu_threads=1", "--json", *extra, cwd=tmp_path)
            for extra in ([], ["--cpu", "--nproc", "2"])]
    assert all(v.returncode == 0 for v in runs), [v.output for v in runs]
    one, two = (json.loads(v.stdout)["metrics"] for v in runs)
    assert one == two and one["accuracy"] == val["accuracy"] and one["loss"] == val["loss"]


def test_an_image_folder_with_more_classes_than_the_model_predicts_is_refused(tmp_path):
    r = mgpu("train", *recipe_args(tmp_path / "shapes"), "model.num_classes=2", "--check", cwd=tmp_path)
    assert_usage_error(r, "data.train: the folder holds 3 classes (circle, square, triangle), but the model "
                          "predicts 2: set the model's num_classes to 3")


def test_a_timm_model_name_typo_gets_a_did_you_mean(tmp_path):
    r = mgpu("train", *recipe_args(tmp_path / "shapes"), "model.name=resnet10", "--check", cwd=tmp_path)
    assert_usage_error(r, "model: 'resnet10' is not a timm model (did you mean", "resnet10t")
