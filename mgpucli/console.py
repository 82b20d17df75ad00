"""Where human output goes: rich, on stderr. Machine output (``--json``) alone goes to stdout."""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


@lru_cache(maxsize=1)
def err_console() -> Console:
    """The console for everything a human reads. rich is imported here, at the first use, not with this module:
    a training worker that prints nothing but plain progress lines never imports it (~2 MiB per process)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def print_error(message: str, rank: int | None = None) -> None:
    """Print a user-facing error (no traceback): ``error: [rank N] message``, in red on a terminal. Without one (a
    worker's log file, a pipe) the same text is printed plainly, without importing rich."""
    prefix = f" [rank {rank}]" if rank is not None else ""
    if not sys.stderr.isatty():
        print(f"error:{prefix} {message}", file=sys.stderr, flush=True)
        return
    from rich.markup import escape

    err_console().print(f"[bold red]error:[/]{escape(prefix)} ", end="")
    err_console().print(message, markup=False, highlight=False)
