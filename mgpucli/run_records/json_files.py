"""JSON files written whole or not at all, and read back without trusting them.

A record may be read while its writer rewrites it, or after its writer was killed. So a write goes to a
temporary file beside the target and replaces it in one rename (a reader sees the old file or the new one,
never half of one), and a read treats a missing, partial or non-object file as absent.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any


def write_json(path: str, data: Any, *, indent: int | None = None) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically. OSError propagates; no temporary file is left."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=indent)
            if indent is not None:
                fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json_object(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is missing, unreadable, partial or not an object."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
