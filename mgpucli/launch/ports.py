"""Is a TCP port free to listen on, and does the master's host resolve? (Checked before anything starts.)

torch's rendezvous store listens on *all* interfaces. With the c10d backend, a store that cannot bind its
port silently connects to whatever already listens there, so a second job would join the first job's store
instead of failing. So mgpu binds a user-given port itself first, the same way the store will (all
interfaces, IPv4 and IPv6, ``SO_REUSEADDR`` so a socket in TIME_WAIT does not count as busy), and refuses a
busy one with exit 2.
"""

from __future__ import annotations

import errno
import random
import socket
import time
from collections.abc import Callable

from mgpucli import procfs
from mgpucli.errors import UsageError


def _bind_problem(family: int, host: str, port: int) -> str | None:
    """None when (host, port) can be bound now, else why not."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None  # this address family does not exist here: nothing can listen on it
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return "already in use on this machine (another job's rendezvous store?)"
            if err.errno == errno.EACCES:
                return "not open to this user (ports below 1024 need root)"
            if err.errno == errno.EADDRNOTAVAIL:
                return None  # e.g. IPv6 compiled in but no IPv6 address configured
            raise
    return None


def port_problem(port: int) -> str | None:
    """None when nothing stops a store from listening on ``port`` on all IPv4 and IPv6 interfaces."""
    return _bind_problem(socket.AF_INET, "0.0.0.0", port) or _bind_problem(socket.AF_INET6, "::", port)


# Ports below the kernel's ephemeral range: a port there is never handed out by anyone's ``bind(("", 0))`` or taken as
# the local end of an outgoing connection, so one picked now stays free until a store listens on it (a kernel pick
# from inside the range can go to another process in between: gloo's pairs, a data loader's connections, another
# launcher's pick). torch's own default, 29500, lies in this band too.
_PICK_FROM = 20000
_PICK_TRIES = 64


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (Linux's ``ip_local_port_range``; its default where unreadable)."""
    text = procfs.text("sys", "net", "ipv4", "ip_local_port_range")
    try:
        low, high = map(int, (text or "").split())
    except ValueError:
        return 32768, 60999
    return low, high


def free_port(pick: Callable[[int, int], int] = random.randrange) -> int:
    """A port nothing listens on now, for a store that starts soon after: a free one below the ephemeral range,
    where nothing but another explicit pick can take it meanwhile; the kernel's pick when none there is free."""
    below = ephemeral_range()[0]
    for _ in range(_PICK_TRIES if below > _PICK_FROM else 0):
        port = pick(_PICK_FROM, below)
        if port_problem(port) is None:
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def check_port_number(port: int, option: str) -> int:
    """A port a store can listen on: 1..65535."""
    if not 1 <= port <= 65535:
        raise UsageError(f"{option} {port}: a TCP port is a number from 1 to 65535.", f"Example: {option} 29500.")
    return port


def require_free_port(port: int, option: str, problem=port_problem) -> None:
    """UsageError (exit 2) naming the busy port, before any process starts."""
    why = problem(port)
    if why:
        raise UsageError(
            f"{option} {port}: port {port} is {why}.",
            f"Pick a free port ({option} P), or leave it out on a single node: mgpu then uses a private "
            "rendezvous on a port the OS picks.",
        )


def _resolve_problem(host: str) -> str | None:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        return f"does not resolve ({getattr(err, 'strerror', None) or err})"
    return None


def host_problem(host: str, wait_s: float = 0.0, resolve: Callable[[str], str | None] = _resolve_problem,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> str | None:
    """None when ``host`` resolves, else why not; tried again every second for up to ``wait_s`` (a pod's DNS name
    appears only once the pod runs, and the pods of a job start together)."""
    deadline = clock() + wait_s
    while True:
        why = resolve(host)
        if why is None or clock() >= deadline:
            return why
        sleep(1.0)


def answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something listens at ``host:port`` now (a plain TCP connection, closed at once: a rendezvous store
    that is not up yet is waited for this way, without torch's client logging each failed try)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def listens_here(host: str, port: int) -> bool:
    """Whether ``host`` is this machine (an address of it), so that a store at ``host:port`` is this machine's to
    host: it can bind there, or something here already does."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(address)
                return True
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    return True
    return False
