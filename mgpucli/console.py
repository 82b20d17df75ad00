"""Where human output goes: rich, on stderr. Machine output (``--json``) alone goes to stdout."""

from __future__ import annotations

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
    """Print a user-facing error (no traceback)."""
    prefix = f" [rank {rank}]" if rank is not None else ""
    err_console().print(f"[bold red]error:[/]{prefix} ", end="")
    err_console().print(message, markup=False, highlight=False)
