"""A client of a rendezvous store (torch's ``TCPStore``), made the one way every caller needs it.

mgpu never hosts the job's store (torch's agent does, in the launcher); it connects to it as one more client: a
worker's attempt keys (:mod:`mgpucli.distributed.runtime`), its heartbeat (:mod:`mgpucli.distributed.heartbeat`),
the audit's meetings (:mod:`mgpucli.audit.session`), and a launcher's view of the other nodes
(:mod:`mgpucli.launch.node_presence`). A client never waits for the other workers (``wait_for_workers=False``: that
wait is the host's, and a client that takes part in it adds to the host's ``init/`` count for nothing), and its
timeout bounds the connection and each call on it. Imports torch inside its functions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"  # where torchrun's agent hosts the job's store


def connect(host: str, port: int | str, timeout_s: float, prefix: str | None = None) -> Any:
    """A client of the store at ``host:port`` (its keys under ``prefix``, when given); raises what torch raises
    when nothing answers within ``timeout_s``."""
    import torch.distributed as dist

    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    return dist.PrefixStore(prefix, store) if prefix is not None else store


def job_store_address(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The job's store, ``(MASTER_ADDR, MASTER_PORT)``, where both are set."""
    env = os.environ if environ is None else environ
    host, port = env.get(MASTER_ADDR, "").strip(), env.get(MASTER_PORT, "").strip()
    return (host, port) if host and port else None


def connect_job_store(timeout_s: float, prefix: str | None = None, environ: Mapping[str, str] | None = None) -> Any:
    """A client of the job's store (:func:`job_store_address`); RuntimeError when the environment names none."""
    where = job_store_address(environ)
    if where is None:
        raise RuntimeError(f"{MASTER_ADDR}/{MASTER_PORT} are not set")
    return connect(*where, timeout_s, prefix)
