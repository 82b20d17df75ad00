"""What the run's own records add to a diagnosis: its settings in the fixes (for a user's script, what the fixes'
recipe settings are in a script's words), nodes that were launched differently, whether the launcher still runs,
and the command that continues the run."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from collections.abc import Sequence
from typing import Any

from mgpucli import env_vars, procfs
from mgpucli.postmortem.lines import LogLine
from mgpucli.postmortem.matchers import Match
from mgpucli.postmortem.reader import RunRecord
from mgpucli.run_records.node_records import last_ranks, named_records
from mgpucli.training_libraries import BY_PACKAGE, package_of

_SETTINGS = ("data.batch_size", "data.num_workers", "trainer.grad_accum", "trainer.timeout_s", "optim.lr")


def tailor(match: Match, run: RunRecord, lines: Sequence[LogLine] = ()) -> None:
    """Put this run's own values into the fix ("data.batch_size (now 64)"), and tell a port mgpu was given
    from one torch picked. A script's run gets fixes in its own terms (:func:`_for_a_script`), or in its training
    library's (:func:`_in_library_terms`; ``lines``: the failing rank's log)."""
    if run.is_script:
        _for_a_script(match, run)
        _in_library_terms(match, run, lines)
    for key in _SETTINGS:
        value = run.recipe_value(key)
        if value is not None:
            match.fix = re.sub(rf"\b{re.escape(key)}\b(?![=\w]| \(now)", f"{key} (now {value})", match.fix, count=1)
    if match.signature == "address_in_use" and match.details.get("port"):
        port = match.details["port"]
        endpoint = str((run.launch.get("rendezvous") or {}).get("endpoint") or "")
        if endpoint.rsplit(":", 1)[-1] == str(port):
            match.fix = (f"Port {port}, the rendezvous port this job was given, was taken by another process (an "
                         f"earlier job or its workers still running? `ss -ltnp | grep :{port}` names it). Stop it or "
                         "pick another --master-port; on one node, leave --master-port out and mgpu uses a private "
                         "rendezvous on a free port.")
        else:
            match.fix = (f"torch picked port {port} for the workers' store (it was free when the launcher chose it), "
                         "and another program took it before rank 0 could listen on it. Nothing in the job needs to "
                         f"change: run it again. If it keeps happening, find what grabs ports (`ss -ltnp | grep "
                         f":{port}`).")


# The fixes name a recipe's settings; a script has the same knobs under other names, and no checkpoint to resume.
_SCRIPT_WORDS = (
    (r"\boptim\.lr\b", "the learning rate"),
    (r"set trainer\.clip_grad_norm=1\.0", "clip the gradients (torch.nn.utils.clip_grad_norm_)"),
    (r"trainer\.precision=bf16", "bf16 autocast"),
    (r"trainer\.strategy=fsdp", "FSDP (fully_shard)"),
    (r"trainer\.grad_accum", "gradient accumulation"),
    (r"data\.batch_size", "the batch size"),
    (r"data\.num_workers=0", "num_workers=0 in the DataLoader"),
    (r"data\.num_workers", "the DataLoader's num_workers"),
    (r"raise trainer\.timeout_s", "raise the process group's timeout (init_process_group(timeout=...))"),
    (r"trainer\.ddp\.find_unused_parameters=true", "DDP(..., find_unused_parameters=True)"),
    (r"trainer\.ddp\.find_unused_parameters=false", "find_unused_parameters=False"),
    (r"trainer\.ddp\.static_graph=true", "DDP(..., static_graph=True)"),
    (r"the same recipe and code: the same recipe file and overrides",
     "the same script, arguments and code: the same script file and arguments"),
    (r"\(and --log-dir\)", "(and --run-dir)"),
    (r"\brun_dir\b", "the script's output directory"),
    (r"[;,]? ?(?:then )?continue (?:it )?(?:from the last checkpoint )?with --resume auto(?: \([^)]*\))?(?::[^.]*)?",
     ""),
    (r" ?Continue with --resume auto\.", ""),
)
_SCRIPT_EXCEPTION_FIX = ("This is an ordinary Python exception in the script (the model, the data, a transform), not a "
                         "distributed problem: the other ranks only stopped because this one did. Fix it where the "
                         "traceback points; it usually reproduces on one process (--cpu --nproc 1).")


def _for_a_script(match: Match, run: RunRecord) -> None:
    """A fix for a user's script: the recipe settings it names in the script's terms, and the command that adds (or
    drops) --local-rank-arg for the legacy local-rank failures."""
    if match.signature == "python_exception":
        match.fix = _SCRIPT_EXCEPTION_FIX
    for pattern, words in _SCRIPT_WORDS:
        match.fix = re.sub(pattern, words, match.fix)
    argv = [str(a) for a in run.launch.get("argv") or []]
    if match.signature == "legacy_local_rank" and argv[1:2] == ["launch"]:
        drop = match.details.get("kind") == "unrecognized" and match.details.get("wants") is None
        fixed = [a for a in argv if a != "--local-rank-arg"] if drop else \
            argv if "--local-rank-arg" in argv else [*argv[:2], "--local-rank-arg", *argv[2:]]
        if fixed != argv:
            match.fix += " Run: " + shlex.join(fixed)
    if match.signature in ("nccl_without_gpus", "cuda_without_gpus") and \
            (run.launch.get("devices") or {}).get("kind") == "cpu":
        match.fix = ("This launch ran CPU workers (--cpu), which see no GPU (their CUDA_VISIBLE_DEVICES is empty). "
                     + match.fix)


_FRAME = re.compile(r'File "(?P<path>[^"]+)", line \d+')


def _in_library_terms(match: Match, run: RunRecord, lines: Sequence[LogLine]) -> None:
    """A failure in what a training library set up for the script (the DDP model Transformers' Trainer, Accelerate
    or Lightning Fabric built) gets the library's fix (:data:`mgpucli.training_libraries.LIBRARIES`), never a raw
    ``DDP(...)`` the user never wrote. The library: the one the audit found behind the job's DDP model (``--audit``),
    else the outermost one on the failing rank's traceback."""
    found = [str((f.get("details") or {}).get("library")) for f in (run.audit or {}).get("findings") or []]
    found += [package_of(hit["path"]) for line in lines for hit in _FRAME.finditer(line.text)]
    library = next((BY_PACKAGE[name] for name in found if name in BY_PACKAGE), None)
    code = library.fixes.get(match.signature) if library is not None else None
    if code:
        match.fix = f"{library.name} built this job's DDP model, so the fix goes through it:\n{code}"
        match.details["library"] = library.package


# What every node of one job must agree on (the recipe's path may differ between machines; its content and the
# overrides give the rendezvous id, so a different recipe shows there).
_NODE_KEYS = (("overrides", "overrides"), ("script", "args"), ("nnodes", "nnodes"), ("devices", "nproc_per_node"),
              ("rendezvous", "id"), ("mgpu_version", "mgpu_version"))


def nodes_disagree(run: RunRecord) -> Match | None:
    """Several nodes' launch records (launch.json, launch.nodeK.json) that disagree on what the job is."""
    if len(run.node_records) < 2:
        return None
    evidence, differ = [], []
    for key, sub in _NODE_KEYS:
        values = [(path, (record.get(key) or {}).get(sub) if key != sub else record.get(key))
                  for path, record in run.node_records]
        if len({json.dumps(v, sort_keys=True) for _, v in values}) > 1:
            name = f"{key}.{sub}" if key != sub else key
            differ.append(name)
            evidence += [LogLine(None, f"{name} = {json.dumps(v)}", path) for path, v in values]
    if not differ:
        return None
    return Match("ranks_disagree", f"the nodes were launched differently ({', '.join(differ)} differ)", None,
                 evidence[:6], "Start every node with the same recipe (same content), the same overrides, the same "
                 "--nnodes and --nproc/--gpus and the same mgpu version; the nodes' launch records are compared here.",
                 details={"differ": differ})


def job_nodes(run: RunRecord) -> list[dict[str, Any]]:
    """A job of several nodes: each node, from its launch record (which one, its host and launcher pid, the node rank
    the job gave it, its global ranks in its last attempt, how its launch ended), then each node it met whose record
    is not in this run dir (``record`` only: the nodes did not share it). [] for a job of one node."""
    read = {os.path.basename(path): record for path, record in run.node_records}
    nodes = [{"record": name, "host": record.get("host") or None,
              "pid": record.get("pid") or (record.get("env") or {}).get(env_vars.LAUNCH_PID),
              "node_rank": record.get("node_rank"), "ranks": last_ranks(record),
              "status": _launch_status(record)} for name, record in read.items()]
    for name in (n for _, record in run.node_records for n in named_records(record)):
        if name not in read and name not in [n["record"] for n in nodes]:
            nodes.append({"record": name, "host": None, "pid": None, "node_rank": None, "ranks": [], "status": None})
    return nodes if len(nodes) > 1 else []


def _launch_status(record: dict[str, Any]) -> str | None:
    status = (record.get("result") or {}).get("status")
    return "launcher gone" if status == "running" and not launcher_alive(record) else status


def launcher_alive(launch: dict[str, Any]) -> bool:
    """The recorded launcher pid still runs ``mgpu launch`` (launch.json is rewritten at the end)."""
    pid = (launch.get("env") or {}).get(env_vars.LAUNCH_PID)
    try:
        args = procfs.command_line(int(pid))
    except (TypeError, ValueError):
        return False
    return args is not None and "mgpu" in "\0".join(args)


def running_verdict(run: RunRecord) -> str:
    train = run.last_metrics("train")
    if not train:
        return "still running: the launcher is alive and no step has been logged yet."
    age = time.time() - float(train.get("time", time.time()))
    return f"still running: last logged step {train.get('step')} (epoch {train.get('epoch')}), {age:.0f} s ago."


def resume_command(launch: dict[str, Any], cwd: str | None = None) -> str | None:
    """The launch's own command line (launch.json's ``argv``, shell-quoted) without ``--resume``/``--overwrite``,
    plus ``--resume auto``; prefixed with ``cd DIR &&`` when the launch ran elsewhere than ``cwd`` (default: the
    current directory), since its recipe and run dir may be relative paths."""
    argv = [str(a) for a in launch.get("argv") or []]
    if not argv:
        return None
    cleaned, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--resume":
            skip = True
            continue
        if arg.startswith("--resume=") or arg == "--overwrite":
            continue
        cleaned.append(arg)
    command = " ".join(shlex.quote(a) for a in cleaned) + " --resume auto"
    where = launch.get("cwd")
    if isinstance(where, str) and where and not _same_dir(where, cwd or os.getcwd()):
        command = f"cd {shlex.quote(where)} && {command}"
    return command


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)
