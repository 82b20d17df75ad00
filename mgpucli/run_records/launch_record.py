"""``RUN_DIR/launch.json``: what was run, and where every rank's logs are.

``mgpu launch`` writes it: the launch's own description (command line, run dir, devices, rendezvous, the
equivalent ``torchrun`` command: the launcher fills that in), the environment variables that matter for a
distributed job (never the whole environment, which may hold secrets), and, for every restart attempt, an index
from global rank to the stdout/stderr/error files of torch's own ``--log-dir`` layout
(``LOG_DIR/<run-id>_<random>/attempt_<n>/<local-rank>/{stdout,stderr}.log, error.json``), then the result. It is
rewritten atomically at the start, at every attempt and at the end, so it is useful even after a SIGKILL.
``mgpu doctor RUN_DIR`` reads it back (node K of a multi-node job writes ``launch.nodeK.json``).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from mgpucli.run_records.json_files import read_json_object, write_json
from mgpucli.run_records.worker_records import started

LAUNCH_JSON = "launch.json"
POSTMORTEM_JSON = "postmortem.json"  # the post-mortem's report, beside launch.json (mgpucli.postmortem.render)

ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "TORCHELASTIC_", "OMP_", "MASTER_", "SLURM_", "GLOO_", "MGPU_")
# Even under a kept prefix, a name like these is a secret (e.g. a token for a model hub): never written.
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|PRIVATE|AUTH", re.IGNORECASE)


def filter_env(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The variables worth recording: the distributed-training prefixes plus ``extra`` names, minus secrets."""
    wanted = set(extra)
    return {
        key: value
        for key, value in sorted(environ.items())
        if (key.startswith(ENV_PREFIXES) or key in wanted) and not _SECRET.search(key)
    }


@dataclass(frozen=True)
class RankFiles:
    """Where one rank's output went in one attempt ("" for a stream left on the terminal)."""

    rank: int
    local_rank: int
    stdout: str
    stderr: str
    error_file: str


@dataclass
class Attempt:
    """One start of the worker group (attempt 0, then one per restart)."""

    attempt: int
    dir: str
    ranks: dict[int, RankFiles] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "dir": self.dir,
                "ranks": {str(r): asdict(f) for r, f in sorted(self.ranks.items())}}


def build_attempt(attempt: int, envs: Mapping[int, Mapping[str, str]], stdouts: Mapping[int, str],
                  stderrs: Mapping[int, str], error_files: Mapping[int, str]) -> Attempt:
    """Index one attempt from what torch's log spec produced (keyed by local rank) and each worker's RANK."""
    ranks: dict[int, RankFiles] = {}
    directory = ""
    for local_rank, env in sorted(envs.items()):
        rank = int(env.get("RANK", local_rank))
        error_file = error_files.get(local_rank, "")
        if error_file and not directory:
            directory = os.path.dirname(os.path.dirname(error_file))
        ranks[rank] = RankFiles(rank, local_rank, stdouts.get(local_rank, ""), stderrs.get(local_rank, ""),
                                error_file)
    return Attempt(attempt=attempt, dir=directory, ranks=ranks)


class LaunchRecord:
    """The content of ``launch.json``, kept in memory and written atomically (from the launcher's main thread and
    its watcher: a lock keeps the writes whole).

    ``header`` is the launch's own description, written first as given. ``path`` is where the record is written
    now; ``final_path`` the run dir's ``launch.json``. The two differ while an earlier run's records are in the
    run dir and this launch's training has not started (``LOG_DIR/launch-<id>/launch.json``): :meth:`promote`
    moves the record there once it has, and moves the earlier launch's ``launch.json`` and ``postmortem.json`` to a
    folder of its own beside it (``LOG_DIR/launch-<its id>/``): no launch's record is ever overwritten.
    """

    def __init__(self, path: str, header: Mapping[str, Any], final_path: str | None = None):
        self.path = path
        self.final_path = final_path or path
        self._lock = threading.Lock()
        self.attempts: list[Attempt] = []
        self.data: dict[str, Any] = {**header, "env": {}, "attempts": [], "result": {"status": "running"}}

    def set_env(self, environ: Mapping[str, str], extra: Iterable[str] = ()) -> None:
        self.data["env"] = filter_env(environ, extra)

    def add_attempt(self, attempt: Attempt) -> None:
        self.attempts = [a for a in self.attempts if a.attempt != attempt.attempt] + [attempt]
        self.data["attempts"] = [a.to_json() for a in self.attempts]

    def attempt(self, number: int) -> Attempt | None:
        return next((a for a in self.attempts if a.attempt == number), None)

    def set_result(self, status: str, exit_code: int, **details: Any) -> None:
        self.data["result"] = {"status": status, "exit_code": exit_code,
                               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **details}

    @property
    def promoted(self) -> bool:
        return self.path == self.final_path

    def training_started(self) -> bool:
        """Whether a worker of the latest attempt marked its training as started (:func:`worker_records.started`)."""
        latest = self.attempts[-1] if self.attempts else None
        return latest is not None and any(started(f.error_file) for f in latest.ranks.values())

    def promote(self) -> None:
        """Make this record the run dir's ``launch.json`` (see the class docstring)."""
        with self._lock:
            if self.promoted:
                return
            pending, self.path = self.path, self.final_path
            self._keep_earlier(os.path.dirname(os.path.dirname(pending)))
            self._write()
            with contextlib.suppress(OSError):
                os.unlink(pending)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(pending))  # its own folder, now empty

    def _keep_earlier(self, log_dir: str) -> None:
        """Move the earlier launch's ``launch.json`` and ``postmortem.json`` out of the way, into
        ``log_dir/launch-<its rendezvous id>/`` (the layout a pending record has)."""
        run_dir = os.path.dirname(self.final_path)
        earlier = read_json_object(self.final_path) or {}
        name = f"launch-{(earlier.get('rendezvous') or {}).get('id') or 'earlier'}"
        dest = os.path.join(log_dir, name)
        number = 1
        while os.path.exists(dest):
            number += 1
            dest = os.path.join(log_dir, f"{name}-{number}")
        for path in (self.final_path, os.path.join(run_dir, POSTMORTEM_JSON)):
            if not os.path.isfile(path):
                continue
            with contextlib.suppress(OSError):
                os.makedirs(dest, exist_ok=True)
                os.replace(path, os.path.join(dest, os.path.basename(path)))

    def write(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        write_json(self.path, self.data, indent=2)


# The shape of what mgpu launch writes, as far as ``mgpu doctor RUN_DIR`` reads it: a type, [item shape],
# {key: shape} ({"*": shape} for any key, which must then be a rank number), or {} for any mapping. A field may be
# null, or absent but for attempts and result.
_RANK_FILES = {"rank": int, "local_rank": int, "stdout": str, "stderr": str, "error_file": str}
_SHAPE = {
    "mgpu_version": str, "argv": [str], "cwd": str, "run_dir": str, "log_dir": str, "nnodes": int, "overrides": [str],
    "devices": {"nproc_per_node": int}, "rendezvous": {}, "env": {},
    "attempts": [{"attempt": int, "dir": str, "ranks": {"*": _RANK_FILES}}],
    "result": {"status": str, "exitcodes": {"*": int}},
}
_JSON_NAMES = {str: "a string", int: "a number", list: "a list", dict: "an object"}


def record_problem(data: Mapping[str, Any]) -> str | None:
    """Why ``data`` (the JSON object in a launch.json) is no launch record that ``mgpu doctor`` can read: none of
    mgpu launch's fields, or a field of another shape (edited by hand, or written by another program); else None."""
    if not any(key in data for key in ("mgpu_version", "argv", "attempts")):
        return "it holds none of the fields mgpu launch writes (mgpu_version, argv, attempts)"
    missing = [key for key in ("attempts", "result") if key not in data]  # written from the first write on
    if missing:
        return f"it has no {' and no '.join(missing)}, which mgpu launch writes from its start on"
    return _shape_problem(data, _SHAPE, "")


def _shape_problem(value: Any, shape: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(shape, type):
        if isinstance(value, shape) and not (shape is int and isinstance(value, bool)):
            return None
        return f"its field {where} is {_json_name(value)}, where mgpu launch writes {_JSON_NAMES[shape]}"
    kind = list if isinstance(shape, list) else dict
    if not isinstance(value, kind):
        return f"its field {where} is {_json_name(value)}, where mgpu launch writes {_JSON_NAMES[kind]}"
    if isinstance(shape, list):
        items: Iterable[tuple[str, Any, Any]] = ((f"{where}[{i}]", item, shape[0]) for i, item in enumerate(value))
    elif "*" in shape:
        bad = next((key for key in value if not str(key).lstrip("-").isdigit()), None)
        if bad is not None:
            return f"its field {where} has the key {bad!r}, where mgpu launch writes rank numbers"
        items = ((f"{where}.{key}", item, shape["*"]) for key, item in value.items())
    else:
        items = ((f"{where}.{key}".lstrip("."), value.get(key), sub) for key, sub in shape.items())
    return next((p for p in (_shape_problem(v, s, w) for w, v, s in items) if p), None)


def _json_name(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    return next((name for kind, name in _JSON_NAMES.items() if isinstance(value, kind)),
                "a number" if isinstance(value, float) else type(value).__name__)
