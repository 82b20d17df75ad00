"""End-to-end: a Transformers recipe's bad data is refused at launch before anything trains (the workers find it):
exit 2, a message naming the problem and its fix, no traceback, nothing written. Each class of bad input refused at
``--check``, in the test process: tests/unit/test_hf_bad_input_check.py."""

from __future__ import annotations

import pytest

from tests.hf_files import make_tokenizer, offline_env, reviews_csv, text_recipe, write_csv
from tests.procs import assert_usage_error, mgpu

pytest.importorskip("transformers")


def test_bad_data_is_refused_at_launch_before_training(tmp_path):
    make_tokenizer(tmp_path / "tokenizer")
    reviews_csv(tmp_path / "val.csv", 16, "val")
    write_csv(tmp_path / "three.csv", [{"text": "a fine film.", "label": i % 3} for i in range(32)])
    recipe = str(text_recipe(tmp_path, "sequence_classification"))
    r = mgpu("launch", "--cpu", "--nproc", "2", recipe, "data.train.files=three.csv", "run_dir=refused",
             cwd=tmp_path, env=offline_env(tmp_path), timeout=120)
    assert_usage_error(r, "the labels run from 0 to 2, but the model's head has 2 labels")
    assert not (tmp_path / "refused" / "checkpoints").exists() and not (tmp_path / "refused" / "metrics.jsonl").exists()
