"""``RUN_DIR/launch.json``: what was run, and where every rank's logs are.

``mgpu launch`` writes it: the launch's own description (command line, run dir, devices, rendezvous, the
equivalent ``torchrun`` command: the launcher fills that in), the environment variables that matter for a
distributed job (never the whole environment, which may hold secrets), and, for every restart attempt, an index
from global rank to the stdout/stderr/error files of torch's own ``--log-dir`` layout
(``LOG_DIR/<run-id>_<random>/attempt_<n>/<local-rank>/{stdout,stderr}.log, error.json``), then the result. It is
rewritten atomically at the start, at every attempt and at the end, so it is useful even after a SIGKILL.
``mgpu doctor RUN_DIR`` reads it back, with every other node's of a job of several nodes (``launch.nodeK.json``, or
``launch.HOST-ID.json`` where the rendezvous ranks the nodes: :mod:`mgpucli.run_records.node_records`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
import time
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from mgpucli.env_vars import PET_PREFIX, RANK, SLURM_PREFIX, WORLD_SIZE
from mgpucli.run_layout import LAUNCH_DIR_PREFIX
from mgpucli.run_layout import LAUNCH_JSON as LAUNCH_JSON  # its names in the run dir
from mgpucli.run_layout import POSTMORTEM_JSON as POSTMORTEM_JSON
from mgpucli.run_records.json_files import read_json_object, write_json
from mgpucli.run_records.worker_records import started

ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "TORCHELASTIC_", "OMP_", "MASTER_", SLURM_PREFIX, PET_PREFIX, "GLOO_",
                "MGPU_")
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


@dataclass(frozen=True)
class RankExit:
    """How one worker process of an attempt ended, as the launcher saw it end: its exit code (negative: killed by that
    signal, as torch reports it; None: it ended, but was reaped before its code was read) and when (epoch seconds)."""

    code: int | None
    time: float


@dataclass
class Attempt:
    """One start of the worker group (attempt 0, then one per restart), and how its workers on this node ended."""

    attempt: int = 0
    dir: str = ""
    ranks: dict[int, RankFiles] = field(default_factory=dict)
    exits: dict[int, RankExit] = field(default_factory=dict)  # global rank -> how it ended (mgpucli.launch.exit_watch)
    # A job of several nodes: the nodes that met for this attempt, each with its launch record's name in the run dir
    # ({"node", "host", "pid", "record"}: mgpucli.launch.rendezvous_watch), so that mgpu doctor finds every node's.
    nodes: list[dict[str, Any]] | None = None
    # An elastic job's attempt that started on other nodes than the one before: who was lost or joined, the step it
    # went on after, its layout, what it cost, and the line said (mgpucli.launch.membership).
    membership: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "dir": self.dir,
                "ranks": {str(r): asdict(f) for r, f in sorted(self.ranks.items())},
                "exits": {str(r): asdict(e) for r, e in sorted(self.exits.items())},
                **({"nodes": self.nodes} if self.nodes is not None else {}),
                **({"membership": self.membership} if self.membership is not None else {})}


def build_attempt(attempt: int, envs: Mapping[int, Mapping[str, str]], stdouts: Mapping[int, str],
                  stderrs: Mapping[int, str], error_files: Mapping[int, str]) -> Attempt:
    """Index one attempt from what torch's log spec produced (keyed by local rank) and each worker's RANK."""
    ranks: dict[int, RankFiles] = {}
    directory = ""
    for local_rank, env in sorted(envs.items()):
        rank = int(env.get(RANK, local_rank))
        error_file = error_files.get(local_rank, "")
        if error_file and not directory:
            directory = os.path.dirname(os.path.dirname(error_file))
        ranks[rank] = RankFiles(rank, local_rank, stdouts.get(local_rank, ""), stderrs.get(local_rank, ""),
                                error_file)
    return Attempt(attempt=attempt, dir=directory, ranks=ranks)


def world_size_of(envs: Mapping[int, Mapping[str, str]]) -> int | None:
    """The job's process count in an attempt, from the WORLD_SIZE torch's agent gave its workers (None: no worker)."""
    first = next(iter(envs.values()), {})
    return int(first.get(WORLD_SIZE, "0") or 0) or None


@dataclass
class Devices:
    kind: str = ""  # cpu | cuda
    nproc_per_node: int = 0
    gpu_indices: list[int] = field(default_factory=list)
    cuda_visible_devices: str | None = None


@dataclass
class RendezvousInfo:
    backend: str = ""
    endpoint: str = ""
    id: str = ""


@dataclass
class ScriptJob:
    """A script launch's job (``mgpu launch SCRIPT.py``): what ran, as the workers got it."""

    path: str | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)
    local_rank_flag: str | None = None
    audit: bool = False


@dataclass
class LaunchHeader:
    """The launch's own description, written before any worker starts."""

    mgpu_version: str = ""
    started: str = ""
    host: str = ""  # where this launcher ran, and its pid: which node's record this is
    pid: int | None = None
    cwd: str = ""
    argv: list[str] = field(default_factory=list)
    job: str = "train"  # train | script
    recipe: str | None = None
    overrides: list[str] = field(default_factory=list)
    script: ScriptJob | None = None
    run_dir: str = ""
    devices: Devices = field(default_factory=Devices)
    nnodes: int = 1  # an elastic job's MAX
    nnodes_min: int | None = None  # an elastic job's MIN (--nnodes MIN:MAX); None: a fixed count
    node_rank: int | None = None
    rendezvous: RendezvousInfo = field(default_factory=RendezvousInfo)
    max_restarts: int = 0
    torchrun: str = ""
    torchrun_args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    set_by_mgpu: dict[str, str] = field(default_factory=dict)
    log_dir: str = ""


@dataclass
class LaunchResult:
    """How the launch ended (``running`` until it does); a detail that does not apply is left out of the JSON."""

    # running | succeeded | failed | stalled | stopped | preempted | unmet | refused | node_lost
    status: str = "running"
    exit_code: int | None = None
    finished: str | None = None
    attempts: int | None = None
    seconds: float | None = None
    first_failed_rank: int | None = None
    exitcodes: dict[int, int] | None = None  # global rank -> exit code, from torch's failure report
    restart_refused: str | None = None
    signal: str | None = None
    step: int | None = None
    stall: dict[str, Any] | None = None
    hang: str | None = None  # after a Ctrl-C on ranks still a while: who held the others up
    # Several nodes: how their rendezvous ended when it ended the launch (unmet: they never met; node_lost: a node
    # lost in training never came back; refused: they met and run different jobs), or where it stood when a signal
    # stopped the launch while they met.
    rendezvous: dict[str, Any] | None = None


@dataclass
class LaunchFile:
    """``launch.json`` as a whole: the header's fields, then the environment, the attempts and the result."""

    header: LaunchHeader
    env: dict[str, str] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    result: LaunchResult = field(default_factory=LaunchResult)

    def to_json(self) -> dict[str, Any]:
        result = {k: v for k, v in _to_json(self.result).items() if v is not None or k == "status"}
        return {**_to_json(self.header), "env": dict(self.env), "attempts": [a.to_json() for a in self.attempts],
                "result": result}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchFile:
        """The record in ``data`` (a launch.json's object); :class:`RecordProblem` when it is no launch record."""
        problem = record_problem(data)
        if problem:
            raise RecordProblem(problem)
        return cls(header=_from_json(LaunchHeader, data), env=dict(data.get("env") or {}),
                   attempts=[_from_json(Attempt, a) for a in data.get("attempts") or []],
                   result=_from_json(LaunchResult, data.get("result") or {}))


class RecordProblem(ValueError):
    """A launch.json that mgpu launch did not write in this shape."""


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    return value


def _from_json(cls: type, data: Mapping[str, Any]) -> Any:
    """``cls`` (a dataclass) from checked JSON: absent or null fields take their defaults, unknown keys are left."""
    hints = typing.get_type_hints(cls)
    values = {f.name: _value(data[f.name], hints[f.name]) for f in dataclasses.fields(cls)
              if data.get(f.name) is not None}
    return cls(**values)


def _value(value: Any, hint: Any) -> Any:
    kind = _kind(hint)
    args = typing.get_args(_required(hint))
    if dataclasses.is_dataclass(kind):
        return _from_json(kind, value)
    if kind is dict and len(args) == 2:
        return {(int(k) if args[0] is int else k): _value(v, args[1]) for k, v in value.items()}
    if kind is list and args:
        return [_value(v, args[0]) for v in value]
    return value


def _required(hint: Any) -> Any:
    """``hint`` without its None (``dict[int, int] | None`` -> ``dict[int, int]``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _kind(hint: Any) -> Any:
    """The one non-None type of ``hint`` (``int | None`` -> int, ``list[str]`` -> list)."""
    hint = _required(hint)
    return typing.get_origin(hint) or hint


class LaunchRecord:
    """The content of ``launch.json`` (a :class:`LaunchFile`), kept in memory and written atomically (from the
    launcher's main thread and its watcher: a lock keeps the writes whole).

    ``header`` is the launch's own description, written first as given. ``path`` is where the record is written
    now; ``final_path`` the run dir's ``launch.json``. The two differ while an earlier run's records are in the
    run dir and this launch's training has not started (``LOG_DIR/launch-<id>/launch.json``): :meth:`promote`
    moves the record there once it has, and moves the earlier launch's ``launch.json`` and ``postmortem.json`` to a
    folder of its own beside it (``LOG_DIR/launch-<its id>/``): no launch's record is ever overwritten.
    """

    def __init__(self, path: str, header: LaunchHeader | Mapping[str, Any], final_path: str | None = None):
        self.path = path
        self.final_path = final_path or path
        self._lock = threading.Lock()
        if not isinstance(header, LaunchHeader):
            header = _from_json(LaunchHeader, header)
        self.file = LaunchFile(header=header)

    @property
    def attempts(self) -> list[Attempt]:
        return self.file.attempts

    @property
    def result(self) -> LaunchResult:
        return self.file.result

    def set_env(self, environ: Mapping[str, str], extra: Iterable[str] = ()) -> None:
        self.file.env = filter_env(environ, extra)

    def add_attempt(self, attempt: Attempt) -> None:
        self.file.attempts = [a for a in self.attempts if a.attempt != attempt.attempt] + [attempt]

    def attempt(self, number: int) -> Attempt | None:
        return next((a for a in self.attempts if a.attempt == number), None)

    def set_result(self, status: str, exit_code: int, **details: Any) -> None:
        self.file.result = LaunchResult(status=status, exit_code=exit_code,
                                        finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **details)

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
        name = f"{LAUNCH_DIR_PREFIX}{(earlier.get('rendezvous') or {}).get('id') or 'earlier'}"
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
        write_json(self.path, self.file.to_json(), indent=2)


_JSON_NAMES = {str: "a string", int: "a number", float: "a number", bool: "true/false", list: "a list",
               dict: "an object"}


def record_problem(data: Mapping[str, Any]) -> str | None:
    """Why ``data`` (the JSON object in a launch.json) is no launch record that ``mgpu doctor`` can read: none of
    mgpu launch's fields, or a field of another type than :class:`LaunchFile` declares (edited by hand, or written
    by another program); else None. A field may be null, or absent but for attempts and result."""
    if not any(key in data for key in ("mgpu_version", "argv", "attempts")):
        return "it holds none of the fields mgpu launch writes (mgpu_version, argv, attempts)"
    missing = [key for key in ("attempts", "result") if key not in data]  # written from the first write on
    if missing:
        return f"it has no {' and no '.join(missing)}, which mgpu launch writes from its start on"
    hints = {**typing.get_type_hints(LaunchHeader), **typing.get_type_hints(LaunchFile)}
    hints.pop("header")
    return _fields_problem(data, hints, "")


def _fields_problem(data: Mapping[str, Any], hints: Mapping[str, Any], where: str) -> str | None:
    return next((p for p in (_type_problem(data.get(name), hint, f"{where}.{name}".lstrip("."))
                             for name, hint in hints.items()) if p), None)


def _type_problem(value: Any, hint: Any, where: str) -> str | None:
    """Why ``value`` is not of the declared type ``hint``, in the words of the post-mortem's refusal; else None."""
    kind = _kind(hint)
    if value is None or kind is Any:
        return None
    expected = dict if dataclasses.is_dataclass(kind) else kind
    if not _fits(value, expected):
        return f"its field {where} is {_json_name(value)}, where mgpu launch writes {_JSON_NAMES[expected]}"
    if dataclasses.is_dataclass(kind):
        return _fields_problem(value, typing.get_type_hints(kind), where)
    args = typing.get_args(_required(hint))
    if kind is list and args:
        return next((p for i, item in enumerate(value) if (p := _type_problem(item, args[0], f"{where}[{i}]"))), None)
    if kind is dict and len(args) == 2:
        if args[0] is int and (bad := next((k for k in value if not str(k).lstrip("-").isdigit()), None)) is not None:
            return f"its field {where} has the key {bad!r}, where mgpu launch writes rank numbers"
        return next((p for k, v in value.items() if (p := _type_problem(v, args[1], f"{where}.{k}"))), None)
    return None


def _fits(value: Any, expected: type) -> bool:
    """JSON's types: true/false is no number, and a whole number is a float too."""
    if isinstance(value, bool):
        return expected is bool
    return isinstance(value, (int, float) if expected is float else expected)


def _json_name(value: Any) -> str:
    return next((name for kind, name in _JSON_NAMES.items() if type(value) is kind), type(value).__name__)
