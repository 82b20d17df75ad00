"""Generated text: an English-like corpus and its character vocabulary (printable ASCII + newline), and rows of
text for the Transformers recipes' datasets (``rows:``).

Made from a fixed grammar and seed, so the text recipes need no download and no data file, and every machine sees
the same text.
"""

from __future__ import annotations

import random
from functools import lru_cache

__all__ = ["review_rows", "corpus_rows"]  # the components (docs/components.md); the rest serves datasets.py

CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(CHARS)  # 96
_INDEX = {c: i for i, c in enumerate(CHARS)}
_UNKNOWN = _INDEX["?"]

_SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the engineer", "a small bird", "the teacher",
             "our neighbour", "the river", "a tired student", "the machine", "the captain"]
_VERBS = ["sees", "likes", "follows", "builds", "carries", "finds", "paints", "watches", "answers", "keeps"]
_OBJECTS = ["the red ball", "a long letter", "the green door", "a quiet song", "the broken clock",
            "a warm bowl of soup", "the tall tree", "an open book", "the last train", "a bright lamp"]
_PLACES = ["in the morning", "near the sea", "after dinner", "at the station", "under the bridge",
           "before the rain", "in the garden", "on monday"]


@lru_cache(maxsize=4)
def corpus(num_chars: int = 200_000, seed: int = 1234) -> str:
    """Deterministic text of about ``num_chars`` characters."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < num_chars:
        sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
        if rng.random() < 0.6:
            sentence += f" {rng.choice(_PLACES)}"
        line = sentence[0].upper() + sentence[1:] + "."
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:num_chars]


def encode(text: str) -> list[int]:
    return [_INDEX.get(c, _UNKNOWN) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(CHARS[i] for i in ids)


_PRAISE = ["wonderful", "great", "delightful", "superb", "charming", "brilliant", "lovely", "excellent"]
_BLAME = ["awful", "boring", "terrible", "dull", "clumsy", "dreadful", "tedious", "poor"]
_THINGS = ["film", "book", "meal", "concert", "hotel", "game", "lecture", "journey", "play", "album"]
_OPENINGS = ["honestly", "all in all", "to be fair", "in short", "i think", "sadly", "happily", "frankly"]


def review_rows(num_samples: int = 2000, seed: int = 0, split: str = "train") -> list[dict[str, object]]:
    """Generated one-sentence reviews and their sentiment (``label``: 1 when more of their verdicts praise than
    blame), for text classification without a download: ``{"text": ..., "label": 0 or 1}`` rows."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for _ in range(num_samples):
        verdicts = [rng.random() < 0.5 for _ in range(rng.choice((1, 3)))]
        words = [rng.choice(_PRAISE if good else _BLAME) for good in verdicts]
        text = f"{rng.choice(_OPENINGS)}, the {rng.choice(_THINGS)} was {', '.join(words[:-1])}"
        text = (text + " and " if len(words) > 1 else text) + words[-1] + "."
        rows.append({"text": text, "label": int(sum(verdicts) * 2 > len(verdicts))})
    return rows


def corpus_rows(num_lines: int = 2000, split: str = "train", seed: int = 1234) -> list[dict[str, str]]:
    """Lines of the generated corpus (:func:`corpus`) as ``{"text": line}`` rows, for language modelling: the
    first 90% of the lines are ``train``, the rest ``val``."""
    lines = corpus(num_chars=num_lines * 80, seed=seed).splitlines()[:num_lines]  # lines average ~45 characters
    cut = len(lines) * 9 // 10
    return [{"text": line} for line in (lines[:cut] if split == "train" else lines[cut:])]
