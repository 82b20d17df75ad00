"""A Transformers recipe's bad input is refused at ``--check`` before anything trains, run in the test process
(tests/inproc.py): exit 2, a message naming the problem and its fix, no traceback, nothing written. The same refusal
at a real launch, found by the workers: tests/e2e/test_hf_bad_input.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hf_files import make_tokenizer, offline_env, reviews_csv, text_recipe, write_csv
from tests.inproc import cli
from tests.procs import assert_usage_error

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf-bad")
    make_tokenizer(folder / "tokenizer")
    reviews_csv(folder / "train.csv", 64, "train")
    reviews_csv(folder / "val.csv", 16, "val")
    write_csv(folder / "three.csv", [{"text": "a fine film.", "label": i % 3} for i in range(32)])
    return folder


def check(folder: Path, *overrides: str):
    recipe = str(text_recipe(folder, "sequence_classification"))
    return cli("train", recipe, *overrides, "--check", cwd=folder, env=offline_env(folder))


CASES = {
    "a text column the dataset lacks": (
        ["data.train.text=review"],
        ["data.train: the text column 'review' is not in the dataset (its columns: text, label"]),
    "a label column the dataset lacks": (
        ["data.val.label=labels"],
        ["data.val: the label column 'labels' is not in the dataset (its columns: text, label; did you mean "
         "'label'?)"]),
    "labels outside the head": (
        ["data.train.files=three.csv"],
        ["data.train: the labels run from 0 to 2, but the model's head has 2 labels (0 to 1): set the model's "
         "num_labels to 3"]),
    "a vocabulary larger than the embeddings": (
        ["model.config.vocab_size=150"],
        ["data.train: the tokenizer has 200 tokens, but the model's embeddings hold 150",
         "data.val: the tokenizer has 200 tokens"]),
    "a local model path that does not exist": (
        ["model.config=null", "+model.name=./tokenizr"],
        ["model.name: ./tokenizr does not exist (did you mean ./tokenizer?)"]),
    "a Hub id not in the cache, offline": (
        ["model.config=null", "+model.name=tiny-org/never-downloaded"],
        ["model.name: 'tiny-org/never-downloaded' is not a local directory and not in the Hugging Face cache, and "
         "HF_HUB_OFFLINE is set", "`hf download tiny-org/never-downloaded`"]),
    "a model without a head, which returns no loss": (
        ["model._target_=transformers.AutoModel.from_config", "~model.head", "~model.num_labels",
         "+model.config._target_=transformers.AutoConfig.for_model", "data.train.head=sequence_classification",
         "data.val.head=sequence_classification"],
        ["task: task sequence_classification gives the model the batch's labels and trains the loss it returns, but "
         "BertModel is a base model without a task head"]),
    "a head mgpu does not build": (
        ["model.head=sequence_clasification"],
        ["model.head: 'sequence_clasification' is not a head mgpu builds (did you mean 'sequence_classification'?)"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_at_check_with_its_fix(text_dir, case):
    overrides, fragments = CASES[case]
    r = check(text_dir, *overrides)
    assert_usage_error(r, *fragments)
    assert not (text_dir / "runs").exists()
