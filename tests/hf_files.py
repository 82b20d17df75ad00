"""Files for the Hugging Face tests, made here without the Hub: a small WordPiece tokenizer trained on local text
and saved as a Transformers tokenizer directory, csv files of generated reviews and corpus lines, and the
environment that keeps every Hugging Face library offline with its caches in the test's folder."""

from __future__ import annotations

import csv
from pathlib import Path

from mgpucli.components.text import corpus_rows, review_rows

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def offline_env(tmp_path: Path) -> dict[str, str]:
    """The Hub never asked, every cache (models, datasets) under ``tmp_path``."""
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"), "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


def make_tokenizer(folder: Path, vocab_size: int = 200) -> Path:
    """A WordPiece tokenizer ([CLS] text [SEP], [PAD] for padding) trained on the reviews and the corpus, saved
    where ``AutoTokenizer.from_pretrained(folder)`` loads it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    text = [r["text"] for r in review_rows(500)] + [r["text"] for r in corpus_rows(500)]
    tokenizer.train_from_iterator(text, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(folder)
    return folder


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def reviews_csv(path: Path, num_samples: int, split: str) -> Path:
    return write_csv(path, review_rows(num_samples, split=split))


def corpus_csv(path: Path, num_lines: int, split: str) -> Path:
    return write_csv(path, corpus_rows(num_lines, split=split))


TINY_MODELS = {
    "bert": {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 64},
    "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64},
}


def text_recipe(folder: Path, head: str, arch: str = "bert", train: str = "train.csv", val: str = "val.csv",
                vocab_size: int = 200, batch_size: int = 16, extra_model: dict | None = None) -> Path:
    """A recipe for a tiny ``arch`` model with ``head`` on csv files in ``folder`` and the tokenizer in
    ``folder/tokenizer`` (paths relative to ``folder``, the run's working directory)."""
    import yaml

    model = {"_target_": "mgpucli.components.hf_models.transformers_model", "head": head,
             "config": {**TINY_MODELS[arch], "vocab_size": vocab_size}, **(extra_model or {})}
    if head == "sequence_classification":
        model["num_labels"] = 2

    def dataset(files: str) -> dict:
        return {"_target_": "mgpucli.components.hf_text.TextDataset", "files": files, "tokenizer": "tokenizer",
                "head": "${model.head}", "max_length": 48}

    recipe = {
        "name": f"hf-{head}", "seed": 0, "model": model,
        "data": {"train": dataset(train), "val": dataset(val), "batch_size": batch_size},
        "task": head,
        "optim": {"_target_": "torch.optim.AdamW", "lr": 0.002},
        "trainer": {"epochs": 2, "log_every": 4, "cpu_threads": 1},
    }
    path = folder / f"{head}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def tagged_jsonl(path: Path, num_lines: int, split: str) -> Path:
    """Token classification rows: each line's words (``tokens``) and a tag per word (``tags``: 1 for a verb of the
    corpus' grammar, 0 otherwise)."""
    import json

    from mgpucli.components.text import _VERBS

    with path.open("w") as out:
        for row in corpus_rows(num_lines, split=split):
            words = row["text"].rstrip(".").split()
            out.write(json.dumps({"tokens": words, "tags": [int(w in _VERBS) for w in words]}) + "\n")
    return path
