"""Install every check in this worker (run once, right after the script imports torch)."""

from __future__ import annotations

from mgpucli.audit.devices import Devices
from mgpucli.audit.divergence import Divergence
from mgpucli.audit.loaders import Loaders
from mgpucli.audit.pace import Pace
from mgpucli.audit.samplers import Samplers
from mgpucli.audit.saves import Saves
from mgpucli.audit.session import Session
from mgpucli.audit.unused import Unused

CHECKS = (Divergence, Loaders, Samplers, Saves, Unused, Devices, Pace)


def install(session: Session | None = None) -> Session:
    """The session, with every check installed (each one that cannot be is a note in the status line)."""
    session = session or Session()
    for check in CHECKS:
        try:
            check(session).install()
        except Exception as err:  # noqa: BLE001 - one check that cannot be installed leaves the others
            session.note(f"{check.__name__} not installed ({type(err).__name__}: {err})")
    return session
