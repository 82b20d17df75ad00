"""Where a Hugging Face model, tokenizer or dataset comes from: a local directory or a Hub id, and whether this
machine has it (stdlib; ``huggingface_hub`` imported inside the functions that need it).

A recipe names a source by a string, as ``from_pretrained`` takes it: an existing directory is local; a string that
can only be a path (it starts with ``.``, ``/`` or ``~``, or has more than one ``/``) and does not exist is a
mistake, told with the closest names in its folder; anything else is a Hub id, found in the Hub cache or
downloaded, unless a directory next to where it would be has a name close to it (``tiny-bret`` beside ``tiny-bert``)
and the Hub does not have it: a local directory misspelt, told with that directory. :func:`source_problem` is what
the recipe check says about one source, before any worker starts: a missing local path, or a Hub id that is not in
the cache while the Hub is out of reach (``HF_HUB_OFFLINE=1``, or no connection), with the command that downloads it.
"""

from __future__ import annotations

import difflib
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

OFFLINE_ENV = "HF_HUB_OFFLINE"  # Hugging Face's own switch: read from the Hub cache only, never the network
REACH_TIMEOUT_S = 3.0
KINDS = ("model", "dataset")  # the Hub's repository types a recipe names


def is_local(source: str) -> bool:
    """A directory that exists, or a string that can only be a path."""
    return Path(source).expanduser().exists() or source.startswith((".", "/", "~")) or source.count("/") > 1


def missing_path_problem(key: str, source: str) -> str:
    """``model.name: ./chekpoints/bert does not exist (did you mean ./checkpoints?)``."""
    path = Path(source).expanduser()
    hint = ""
    parent = next((p for p in path.parents if p.is_dir()), None)
    if parent is not None:
        part = path.relative_to(parent).parts[0]
        close = difflib.get_close_matches(part, [c.name for c in parent.iterdir()], n=1, cutoff=0.6)
        if close:  # in the user's own spelling: the wrong part replaced, what came before it kept
            hint = f" (did you mean {source[:source.rfind(part)] + close[0] if part in source else parent / close[0]}?)"
    return f"{key}: {source} does not exist{hint}"


def closest_directory(source: str) -> str | None:
    """The directory next to where ``source`` would be whose name is closest to its own, in the user's spelling
    (``tiny-bret`` -> ``tiny-bert``, ``models/tiny-bret`` -> ``models/tiny-bert``); None when that folder does not
    exist or holds no directory of a close name."""
    spelled = source.rstrip("/")
    path = Path(spelled).expanduser()
    if not path.name or not path.parent.is_dir():
        return None
    try:
        names = [c.name for c in path.parent.iterdir() if c.is_dir()]
    except OSError:
        return None
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return spelled[: len(spelled) - len(path.name)] + close[0] if close else None


def offline() -> bool:
    """``HF_HUB_OFFLINE`` set: the Hub libraries read their cache only."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def in_cache(source: str, kind: str) -> bool:
    """The Hub id is in this machine's Hub cache (``huggingface_hub``; a dataset also in ``datasets``' own cache)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot_download(source, repo_type=kind, local_files_only=True)
        return True
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    if kind != "dataset":
        return False
    from datasets import config

    return (Path(config.HF_DATASETS_CACHE) / source.replace("/", "___")).is_dir()


def on_hub(source: str, kind: str) -> bool | None:
    """Whether the Hub has the ``kind`` repository ``source`` (None: it did not say: an error, a malformed id)."""
    from huggingface_hub import HfApi

    try:
        return bool(HfApi().repo_exists(source, repo_type=kind))
    except Exception:  # noqa: BLE001 - the Hub's or the request's error: no answer
        return None


def hub_reachable(timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """A TCP connection to the Hub's endpoint opens within ``timeout_s``."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def download_command(source: str, kind: str) -> str:
    return f"hf download {source}" + (" --repo-type dataset" if kind == "dataset" else "")


def source_problem(key: str, source: str, kind: str, reachable=hub_reachable, has=on_hub) -> str | None:
    """What is wrong with ``source`` (the value of recipe key ``key``, a ``kind`` repository) on this machine, or
    None: a local path that does not exist (a directory misspelt: :func:`closest_directory`, unless the Hub has the
    name), or a Hub id neither in the cache nor downloadable now. ``reachable()``, ``has(source, kind)``: the Hub's
    answers (:func:`hub_reachable`, :func:`on_hub`)."""
    if Path(source).expanduser().exists():
        return None
    if is_local(source):
        return missing_path_problem(key, source)
    if in_cache(source, kind):
        return None
    close = closest_directory(source)
    if offline():
        why = f"{OFFLINE_ENV} is set"
    elif not reachable():
        why = "the Hub does not answer from this machine"
    elif close is None:
        return None  # downloaded at the first use, once per machine (huggingface_hub locks each file)
    else:
        found = has(source, kind)
        if found:
            return None
        if found is False:
            return f"{key}: {source} is not a directory here (did you mean {close}?), nor a {kind} on the Hugging " \
                   "Face Hub"
        why = "the Hub did not say whether it has it"
    if close is not None:
        return (f"{key}: {source} is not a directory here (did you mean {close}?); as a Hub id it is not in the "
                f"Hugging Face cache, and {why}; point {key} at the directory, or download it where the Hub answers "
                f"with `{download_command(source, kind)}`")
    return (f"{key}: '{source}' is not a local directory and not in the Hugging Face cache, and {why}; download it "
            f"where the Hub answers with `{download_command(source, kind)}` (HF_HOME sets the cache), or point "
            f"{key} at a local directory")
