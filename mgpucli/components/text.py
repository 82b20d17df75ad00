"""A small generated English-like corpus and its character vocabulary (printable ASCII + newline).

Made from a fixed grammar and seed, so the char LM recipe needs no download and no data file, and every
machine sees the same text.
"""

from __future__ import annotations

import random
from functools import lru_cache

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
