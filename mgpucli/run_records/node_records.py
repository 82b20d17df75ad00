"""Which launch records in a run dir are its latest job's, whatever their names (stdlib only).

A job of several nodes on a run dir they share leaves one launch record per node: ``launch.json`` and
``launch.nodeK.json`` on a static rendezvous (its node ranks are fixed), ``launch.HOST-ID.json`` where the rendezvous
ranks the nodes itself (c10d, at every round of an elastic job; a host name is not unique), ``launch.HOST.json``
from earlier versions. The same run dir may still hold an earlier job's records under names of their own. The
latest job's: the record written last (or the one asked for), every record it names among the nodes it met (each
attempt's ``nodes``: :mod:`mgpucli.launch.rendezvous_watch`), and theirs in turn. A record that names none (a job of
one node, nodes that never met, a version that did not name them) takes those that name none either: with a node rank
in their names where its name has one (each node rank's latest record), else of its rendezvous id.
The first record of the job is the one to read it from (:func:`_first_of`).
"""

from __future__ import annotations

import os
from typing import Any

from mgpucli.run_layout import LAUNCH_JSON, is_launch_json, record_node_rank
from mgpucli.run_records.json_files import read_json_object


def records_in(run_dir: str) -> list[str]:
    """The paths of every launch record at the top of ``run_dir``, by name."""
    try:
        names = sorted(n for n in os.listdir(run_dir) if is_launch_json(n))
    except OSError:
        return []
    return [os.path.join(run_dir, n) for n in names if os.path.isfile(os.path.join(run_dir, n))]


def job_records(run_dir: str, chosen: str | None = None) -> list[tuple[str, dict[str, Any] | None]]:
    """(path, JSON object: None when it cannot be read) of every record of the latest job in ``run_dir``
    (``chosen``: the job of that record instead), the one to read the job from first (see the module); [] when the
    run dir holds none."""
    paths = records_in(run_dir)
    if chosen is not None and os.path.abspath(chosen) not in paths:
        paths.append(os.path.abspath(chosen))
    if not paths:
        return []
    read = {path: read_json_object(path) for path in paths}
    newest = os.path.abspath(chosen) if chosen is not None else max(paths, key=_written)
    job = _named_from(newest, read, run_dir)
    if not named_records(read.get(newest) or {}):
        job |= _unnamed_peers(newest, read)
    ordered = sorted(job, key=lambda p: (p != _first_of(job, read, newest), os.path.basename(p)))
    return [(path, read[path]) for path in ordered]


def named_records(record: dict[str, Any]) -> list[str]:
    """The launch records' names ``record`` names among the nodes its attempts met (its own among them)."""
    names = []
    for attempt in record.get("attempts") or []:
        for node in (attempt.get("nodes") or []) if isinstance(attempt, dict) else []:
            name = node.get("record") if isinstance(node, dict) else None
            if isinstance(name, str) and is_launch_json(name) and name not in names:
                names.append(name)
    return names


def _named_from(newest: str, read: dict[str, dict[str, Any] | None], run_dir: str) -> set[str]:
    """``newest`` and the records it names, and those they name, that are in the run dir."""
    job, todo = {newest}, [newest]
    while todo:
        for name in named_records(read.get(todo.pop()) or {}):
            path = os.path.join(run_dir, name)
            if path in read and path not in job:
                job.add(path)
                todo.append(path)
    return job


def _unnamed_peers(newest: str, read: dict[str, dict[str, Any] | None]) -> set[str]:
    """The records that name no node either, of ``newest``'s job: those with a node rank in their names when
    ``newest`` has one (a static job's: each node rank's latest record), else those of its rendezvous id."""
    unnamed = {p for p, r in read.items() if r is not None and not named_records(r)}
    if record_node_rank(os.path.basename(newest)) is not None:
        return {p for p in unnamed if record_node_rank(os.path.basename(p)) is not None}
    rendezvous = _rendezvous_id(read.get(newest))
    return {p for p in unnamed if rendezvous and _rendezvous_id(read[p]) == rendezvous}


def _first_of(job: set[str], read: dict[str, dict[str, Any] | None], newest: str) -> str:
    """The record to read the job from: ``launch.json`` (a static job's node 0, a job of one node); else the node's
    that took part in the most attempts (an elastic job's longest there), then the one whose workers held global
    rank 0 at the end, then the newest."""
    first = next((p for p in job if os.path.basename(p) == LAUNCH_JSON and read.get(p) is not None), None)
    if first is not None:
        return first
    readable = [p for p in job if read.get(p) is not None]
    if not readable:
        return newest
    return max(readable, key=lambda p: (len((read[p] or {}).get("attempts") or []), 0 in last_ranks(read[p]),
                                        _written(p)))


def last_ranks(record: dict[str, Any] | None) -> list[int]:
    """The global ranks of ``record``'s node in its last attempt."""
    attempts = (record or {}).get("attempts") or []
    last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
    ranks = last.get("ranks") if isinstance(last.get("ranks"), dict) else {}
    return sorted(int(r) for r in ranks if str(r).lstrip("-").isdigit())


def _rendezvous_id(record: dict[str, Any] | None) -> str | None:
    rendezvous = (record or {}).get("rendezvous")
    found = rendezvous.get("id") if isinstance(rendezvous, dict) else None
    return found if isinstance(found, str) else None


def _written(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0
