"""Text datasets for Hugging Face Transformers models: local files or a Hub dataset, tokenized as the recipe says,
once per machine, and padded per batch (needs ``mgpu[hf]``).

Tokenizing is done by the first process of a machine to get there; the others wait for its lock and read the
result from the ``datasets`` cache (beside the dataset's own cache files), so a job of N processes tokenizes once.
A dataset held only in memory (no cache files) is tokenized by each process.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from mgpucli.components.hf_models import HEADS
from mgpucli.errors import UsageError

__all__ = ["TextDataset"]

IGNORE = -100  # the label Transformers' losses skip (the tasks' mgpucli.engine.tasks.model_outputs.IGNORE)
FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
HUB_ARGUMENTS = {"tokenizer": "model", "path": "dataset"}


def load_tokenizer(tokenizer: Any, head: str) -> Any:
    """A tokenizer object, or the one a Hub id or local directory names; causal LMs without a padding token pad
    with their end-of-sequence token (as GPT-2's users do)."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    if tokenizer.pad_token is None and head == "causal_lm" and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token is None:
        raise UsageError(f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no padding token, which "
                         "padding a batch needs.", "Use a tokenizer with a pad token.")
    return tokenizer


def _load(files: str | list[str] | None, path: str | None, name: str | None, split: str, rows: Any) -> Any:
    """The raw ``datasets.Dataset``: local files (the format from their extension), a Hub dataset / directory, or
    rows held in memory."""
    from datasets import Dataset as Rows
    from datasets import load_dataset

    if sum(source is not None for source in (files, path, rows)) != 1:
        raise UsageError("the dataset needs one of files (local csv/json/jsonl/parquet/txt files), path (a Hub "
                         "dataset id or a local dataset directory) or rows (in memory).",
                         "e.g. files=data/train.csv, or path=imdb.")
    if rows is not None:
        return rows if isinstance(rows, Rows) else Rows.from_list(list(rows))
    if path is not None:
        return load_dataset(path, name, split=split)
    listed = [files] if isinstance(files, str) else list(files)
    missing = [f for f in listed if not Path(f).is_file()]
    if missing:
        from mgpucli.hub import missing_path_problem

        raise UsageError("; ".join(missing_path_problem("files", f) for f in missing), "Fix the dataset's files.")
    kinds = {FORMATS.get(Path(f).suffix.lower()) for f in listed}
    if None in kinds or len(kinds) > 1:
        raise UsageError(f"files: {', '.join(listed)}: one format of {', '.join(FORMATS)} is needed.",
                         "Convert the files, or load them with your own dataset _target_.")
    kind = kinds.pop()
    extra = {"delimiter": "\t"} if all(f.endswith(".tsv") for f in listed) else {}
    return load_dataset(kind, data_files=listed, split=split, **extra)


def _column_problem(data: Any, role: str, column: str) -> str | None:
    if column in data.column_names:
        return None
    close = difflib.get_close_matches(column, data.column_names, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"the {role} column '{column}' is not in the dataset (its columns: {', '.join(data.column_names)}{hint})"


class TextDataset(Dataset):
    """Text for a Transformers model with a ``head`` (sequence_classification, token_classification, causal_lm,
    masked_lm; usually ``${model.head}``): local ``files`` (csv, tsv, json, jsonl, parquet, txt) or a Hub dataset
    ``path`` (with its config ``name``), its ``split`` (slices too: ``train[:90%]``), or ``rows`` held in memory (a
    list of dicts, or a ``datasets.Dataset``), tokenized by ``tokenizer``
    (a Hub id, a local directory, or a tokenizer object) from the ``text`` column (two columns: a pair), truncated to
    ``max_length``, with class ids from the ``label`` column (classification; ``labels`` lists the classes in order
    when it holds names; token classification: a list per row, one per word of ``text``). Batches are padded to
    their longest row; causal_lm's labels are its input ids (-100 at padding), masked_lm masks ``mlm_probability``
    of the tokens: the same tokens of a row every time, from ``seed`` (what exact validation needs), or new ones
    each time a row is drawn with ``dynamic_masking: true`` (for the train set)."""

    hub_arguments = HUB_ARGUMENTS

    def __init__(self, tokenizer: Any, files: Any = None, path: str | None = None, name: str | None = None,
                 split: str = "train", rows: Any = None, head: str = "sequence_classification", text: Any = "text",
                 label: str | None = "label", labels: list[str] | None = None, max_length: int = 128,
                 truncation: bool = True, mlm_probability: float = 0.15, seed: int = 0,
                 dynamic_masking: bool = False):
        if head not in HEADS:
            raise UsageError(f"head: '{head}' is not one of {', '.join(HEADS)}.", "Set head to the model's head.")
        self.head, self.labels, self.max_length, self.truncation = head, labels, max_length, truncation
        self.text = [text] if isinstance(text, str) else list(text)
        self.label = label if head in ("sequence_classification", "token_classification") else None
        self.mlm_probability, self.seed = mlm_probability, seed
        self.static_masks = head == "masked_lm" and not dynamic_masking
        self.split = split
        self.tokenizer = load_tokenizer(tokenizer, head)
        if self.static_masks and self.tokenizer.mask_token_id is None:
            raise UsageError("masked_lm needs a tokenizer with a mask token, and this one has none.",
                             "Use the model's own tokenizer (BERT's, RoBERTa's...).")
        raw = _load(files, path, name, split, rows)
        problems = [p for role, column in [*(("text", c) for c in self.text), ("label", self.label)]
                    if column is not None and (p := _column_problem(raw, role, column))]
        if problems:
            raise UsageError("; ".join(problems), "Name the dataset's columns in text (and label).")
        self.data = self._tokenized(raw)
        self.collate_fn = self._collator()

    def _tokenized(self, raw: Any) -> Any:
        """``raw`` tokenized (with its labels), once per machine: under a lock, from the cache when it is there."""
        key = self._key(raw)
        settings = {"batched": True, "with_indices": True, "remove_columns": list(raw.column_names),
                    "new_fingerprint": key}
        if not raw.cache_files:  # held in memory: nothing to share with the other processes
            return raw.map(self._tokenize_rows, **settings)
        from filelock import FileLock

        cached = Path(raw.cache_files[0]["filename"]).parent / f"mgpu-tokenized-{key}.arrow"
        with FileLock(str(cached) + ".lock"):
            return raw.map(self._tokenize_rows, cache_file_name=str(cached), load_from_cache_file=True,
                           desc="tokenizing", **settings)

    def _key(self, raw: Any) -> str:
        """What the tokenized rows depend on: the rows (the dataset's cache files, which ``datasets`` names after
        the data files and their versions, the split, the row count), the tokenizer's vocabulary, every setting."""
        tokenizer = self.tokenizer
        vocabulary = json.dumps(sorted(tokenizer.get_vocab().items()))
        facts = [[f["filename"] for f in raw.cache_files], self.split, len(raw), type(tokenizer).__name__,
                 vocabulary, self.head, self.text, self.label, self.labels, self.max_length, self.truncation,
                 self.static_masks and (self.mlm_probability, self.seed)]
        return hashlib.sha256(json.dumps(facts, default=str).encode()).hexdigest()[:24]

    def _tokenize_rows(self, rows: dict[str, list], indices: list[int]) -> dict[str, list]:
        columns = [rows[c] for c in self.text]
        words = self.head == "token_classification"
        encoded = self.tokenizer(*columns, truncation=self.truncation, max_length=self.max_length,
                                 is_split_into_words=words, return_special_tokens_mask=self.static_masks)
        if self.head == "sequence_classification":
            encoded["labels"] = [self._class_id(v) for v in rows[self.label]]
        elif words:
            encoded["labels"] = [self._word_labels(encoded.word_ids(i), row) for i, row in enumerate(rows[self.label])]
        elif self.static_masks:
            special = encoded.pop("special_tokens_mask")
            masked = [self._mask(ids, skip, index) for ids, skip, index in zip(encoded["input_ids"], special, indices,
                                                                                strict=True)]
            encoded["input_ids"], encoded["labels"] = [m[0] for m in masked], [m[1] for m in masked]
        return dict(encoded)

    def _mask(self, ids: list[int], special: list[int], index: int) -> tuple[list[int], list[int]]:
        """Row ``index``'s masked ids and labels, the same every time (BERT's rule: of the chosen tokens, 80% become
        the mask token, 10% a random token, 10% stay)."""
        import random

        draw = random.Random(f"{self.seed}-{index}")
        inputs, labels = list(ids), [IGNORE] * len(ids)
        for i, token in enumerate(ids):
            if special[i] or draw.random() >= self.mlm_probability:
                continue
            labels[i] = token
            kind = draw.random()
            if kind < 0.8:
                inputs[i] = self.tokenizer.mask_token_id
            elif kind < 0.9:
                inputs[i] = draw.randrange(len(self.tokenizer))
        return inputs, labels

    def _class_id(self, value: Any) -> int:
        if isinstance(value, str):
            if not self.labels:
                raise UsageError(f"the label column '{self.label}' holds names ({value!r}...), not class ids.",
                                 "List the classes in order with the dataset's labels=[...], e.g. labels=[neg,pos].")
            if value not in self.labels:
                raise UsageError(f"label {value!r} is not in labels ({', '.join(self.labels)}).",
                                 "Add it to the dataset's labels, or fix the data.")
            return self.labels.index(value)
        return int(value)

    def _word_labels(self, word_ids: list[int | None], row: list[Any]) -> list[int]:
        """A word's label on its first token, -100 on its later tokens and on special tokens."""
        out, previous = [], None
        for word in word_ids:
            out.append(IGNORE if word is None or word == previous else self._class_id(row[word]))
            previous = word
        return out

    def _collator(self) -> Any:
        import transformers

        if self.head == "token_classification" or self.static_masks:  # labels padded with -100
            collate = transformers.DataCollatorForTokenClassification(self.tokenizer)
        elif self.head in ("causal_lm", "masked_lm"):
            collate = transformers.DataCollatorForLanguageModeling(
                self.tokenizer, mlm=self.head == "masked_lm", mlm_probability=self.mlm_probability)
        else:
            collate = transformers.DataCollatorWithPadding(self.tokenizer)
        return _AsDict(collate)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.data[index]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        """A batch's rows in one read (torch's loaders call it for a whole batch; row by row was ~40% of a tiny
        model's step)."""
        columns = self.data[list(indices)]
        return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]

    def model_problems(self, model: Any) -> list[str]:
        """What doesn't fit between these rows and ``model``: a vocabulary larger than its embeddings, class ids
        outside its head's labels."""
        problems = []
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        rows = getattr(embeddings, "num_embeddings", None)
        if rows is not None and len(self.tokenizer) > rows:
            problems.append(f"the tokenizer has {len(self.tokenizer)} tokens, but the model's embeddings hold "
                            f"{rows}: token ids from {rows} on have no embedding (set the model's vocab_size to at "
                            f"least {len(self.tokenizer)}, or use the model's own tokenizer)")
        classes = getattr(getattr(model, "config", None), "num_labels", None)
        if self.label is not None and classes:
            found = self._label_range()
            if found and (found[0] < 0 or found[1] >= classes):
                problems.append(f"the labels run from {found[0]} to {found[1]}, but the model's head has {classes} "
                                f"labels (0 to {classes - 1}): set the model's num_labels to {found[1] + 1}, or fix "
                                "the label column")
        return problems

    def _label_range(self) -> tuple[int, int] | None:
        values = [v for row in self.data["labels"] for v in (row if isinstance(row, list) else [row]) if v != IGNORE]
        return (min(values), max(values)) if values else None


class _AsDict:
    """A Transformers collator whose ``BatchEncoding`` comes back as a plain dict (what mgpu moves to the device)."""

    def __init__(self, collate: Any):
        self.collate = collate

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return dict(self.collate(rows))
