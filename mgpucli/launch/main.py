"""``mgpu launch`` end to end: check the recipe (or find the script) once, build the plan, then run it (or print it)."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
import threading
import time
from dataclasses import replace

from mgpucli import __version__
from mgpucli.cpus import available_cores, omp_threads_problem
from mgpucli.errors import UsageError
from mgpucli.launch.elastic_plan import add_global_batch
from mgpucli.launch.plan import (
    JobNodes,
    LaunchOptions,
    LaunchPlan,
    Machine,
    RecipeFacts,
    build_plan,
    check_job_options,
    job_nodes,
    script_facts,
    worker_overrides,
)
from mgpucli.launch.script import check_target, default_run_dir, local_rank_flag
from mgpucli.run_files import check_start, holds_a_run, requested_sharded, unwritable
from mgpucli.run_layout import AUDIT_JSON, LAUNCH_DIR_PREFIX
from mgpucli.run_records.launch_record import Devices, LaunchHeader, RendezvousInfo, ScriptJob


def _check_recipe(opts: LaunchOptions):
    """(facts, the checked recipe): the recipe is what the workers get (see mgpucli.config.handoff)."""
    facts, cfg = _compose(opts)
    _deep_check(cfg, opts)
    return facts, cfg


def _compose(opts: LaunchOptions, composing=None):
    """(facts, the recipe composed with the workers' overrides and checked against the schema): what the plan and
    the run-dir check need, quickly (no torch). ``composing``: a child process composing it
    (:mod:`mgpucli.launch.compose_child`), whose answer is taken when it gave one."""
    from omegaconf import OmegaConf

    from mgpucli.engine.run import ensure_cwd_on_path

    overrides = worker_overrides(opts)
    ensure_cwd_on_path()
    cfg = composing.result() if composing is not None else None
    if cfg is None:
        from mgpucli.config import load_recipe

        cfg = load_recipe(opts.recipe, overrides)
    threads = OmegaConf.select(cfg, "trainer.cpu_threads", default=None)
    facts = RecipeFacts(
        run_dir=str(OmegaConf.select(cfg, "run_dir", default=f"runs/{cfg.name}")),
        device=str(OmegaConf.select(cfg, "trainer.device", default="auto")),
        strategy=str(OmegaConf.select(cfg, "trainer.strategy", default="auto")),
        cpu_threads=int(threads) if threads is not None else None,
    )
    return facts, cfg


def _deep_check(cfg, opts: LaunchOptions) -> None:
    """The rest of the check, exit 2 on any problem: the ``_target_``s and trackers, and the optimizer, scheduler,
    task and model built (meta device). A launch runs it while its workers start, and its local rank 0 builds the
    components (:func:`_check_while_workers_start`), so that this process never imports torch's dynamo."""
    from mgpucli.config.components import check_builds

    _check_targets(cfg, opts)
    check_builds(cfg, opts.recipe)  # the optimizer, scheduler, task and model (meta device)


def _check_targets_now(cfg, opts: LaunchOptions, refused: threading.Event):
    """The launch's gate (:mod:`mgpucli.launch.gate`), its check begun: the targets, at once (in a thread); a refusal
    sets ``refused``."""
    from mgpucli.launch.gate import Gate

    def end() -> None:
        refused.set()
        _end_workers()

    gate = Gate()
    gate.begin(lambda: _check_targets(cfg, opts), end)
    return gate


def _end_workers() -> None:
    """On a refusal: the workers killed (if any started yet), torch's agent quiet about it (the check's error is what
    the user sees)."""
    import logging

    from mgpucli.proctree import kill_children

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    kill_children()


def _check_targets(cfg, opts: LaunchOptions) -> None:
    """Every ``_target_`` imports and takes its arguments, the Hugging Face sources can be read, the trackers named
    import (exit 2 on any problem)."""
    from mgpucli.config import check_recipe

    check_recipe(cfg, opts.recipe, trackers="import")


def this_machine(need_gpus: bool) -> Machine:
    """The real machine (the CUDA count is asked for only when GPUs may be used: it costs a CUDA init)."""
    visible = 0
    if need_gpus:
        import torch

        visible = torch.cuda.device_count()
    return Machine(visible_gpus=visible, cpu_count=available_cores(), hostname=socket.gethostname(),
                   environ=dict(os.environ))


def _check_options(opts: LaunchOptions) -> None:
    """What is refused before the recipe or the script is looked at."""
    check_job_options(opts)
    problem = omp_threads_problem(os.environ)
    if problem:  # every worker would inherit it
        raise UsageError(f"{problem}.", "Unset it (`unset OMP_NUM_THREADS`) and mgpu gives each CPU worker cores / "
                         "processes threads, or give a count: export OMP_NUM_THREADS=4.")


def _prepare(opts: LaunchOptions, nodes: JobNodes, claim_run_dir: bool = False, deep: bool = True, composing=None):
    """(the plan, the checked recipe: None for a script). ``nodes``: the job's nodes, checked
    (:func:`mgpucli.launch.plan.job_nodes`). ``claim_run_dir``: a script launched without --run-dir creates its new
    run dir now (a real launch); else it is only named (--dry-run). ``deep``: the whole recipe check here (else the
    caller runs :func:`_deep_check` while the workers start). ``composing``: the recipe being composed in a child
    process (:mod:`mgpucli.launch.compose_child`). The options are checked (:func:`_check_options`)."""
    if opts.script is not None:
        return _prepare_script(opts, nodes, claim_run_dir), None
    facts, cfg = _check_recipe(opts) if deep else _compose(opts, composing)
    machine = this_machine(need_gpus=not opts.cpu and facts.device != "cpu")
    plan = build_plan(opts, facts, machine, checked_nodes=nodes)
    add_global_batch(plan, cfg, opts.resume)  # an elastic job's, over its node range (mgpucli/launch/elastic_plan.py)
    if plan.node_rank == 0:  # this node's rank 0 takes the run dir: refuse here what it would refuse there
        found = check_run_dir(plan.run_dir, opts, sharded=requested_sharded(cfg.trainer.checkpoint_format))
        if found is not None:
            _check_global_batch(str(found), plan, cfg, opts)
    return plan, cfg


def _check_global_batch(checkpoint: str, plan: LaunchPlan, cfg, opts: LaunchOptions) -> None:
    """A resume on a process count no whole grad_accum keeps the checkpoint's global batch on: refused here, as
    every worker would (:func:`mgpucli.batch_layout.keep_global_batch`), before any starts."""
    from mgpucli.batch_layout import keep_global_batch, pinned_by
    from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info

    info = read_checkpoint_info(checkpoint)
    if info is not None and info.segments:
        keep_global_batch(info.segments[-1].layout, plan.nproc_per_node * plan.nnodes, int(cfg.data.batch_size),
                          int(cfg.trainer.grad_accum), pinned_by(opts.overrides))


def _prepare_script(opts: LaunchOptions, nodes: JobNodes, claim_run_dir: bool) -> LaunchPlan:
    """The plan for the user's own script: it exists (nothing of it is run here), the spelling of --local-rank-arg
    its source declares, and a run dir of its own."""
    script = opts.script
    if script is None:
        raise ValueError("not a script launch")
    source = check_target(script)
    notes = []
    if opts.local_rank_arg:
        flag, note = local_rank_flag(source)
        script = replace(script, local_rank_flag=flag)
        opts = replace(opts, script=script)
        notes.append(note)
    if opts.audit:
        script = replace(script, audit=True)
        opts = replace(opts, script=script)
        notes.append("--audit: every worker checks the script for the tutorial's traps as it runs; findings are shown "
                     f"here and written to RUN_DIR/{AUDIT_JSON} (the torchrun equivalent runs without the checks).")
    if opts.run_dir is not None:
        problem = unwritable(opts.run_dir)
        if problem:
            raise UsageError(f"cannot create run dir {opts.run_dir}: {problem}.",
                             "Choose another location with --run-dir DIR (or fix the path/permissions).")
    machine = this_machine(need_gpus=not opts.cpu)
    plan = build_plan(opts, script_facts(opts), machine, checked_nodes=nodes,
                      name_run_dir=lambda nnodes, rdzv_id: default_run_dir(script.name, nnodes, rdzv_id,
                                                                          claim=claim_run_dir))
    plan.notes += notes
    return plan


def check_run_dir(run_dir: str, opts: LaunchOptions, sharded: bool | None = False):
    """The run-dir rule the workers' rank 0 applies (:func:`mgpucli.run_files.check_start`), before any worker
    starts; a refusal names the commands that fix it. Returns the checkpoint the run resumes (None: fresh)."""
    try:
        return check_start(run_dir, opts.resume, opts.overwrite, sharded)
    except UsageError as err:
        if opts.resume or opts.overwrite or "already holds checkpoints" not in err.message:
            raise
        if sys.argv[1:2] != ["launch"]:
            raise
        base = ["mgpu", *(a for a in sys.argv[1:] if a not in ("--dry-run", "--check"))]
        raise UsageError(err.message, "\n".join([
            "Continue it:      " + shlex.join([*base, "--resume", "auto"]),
            "Start afresh:     " + shlex.join([*base, "--overwrite"]) + "   (deletes its checkpoints)",
            "Or a new run dir: " + shlex.join([*base, "name=NEW_NAME"]) + "   (or run_dir=PATH)",
        ])) from None


def _make_run_dir(run_dir: str) -> None:
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as err:
        path = os.path.abspath(run_dir)
        blocker = next((p for p in _parents(path) if os.path.exists(p) and not os.path.isdir(p)), None)
        why = f"{blocker} is a file, not a directory" if blocker else (err.strerror or str(err))
        raise UsageError(
            f"cannot create run dir {run_dir}: {why}.",
            "Choose another location with run_dir=PATH (or fix the path/permissions).",
        ) from None


def _parents(path: str) -> list[str]:
    out = [path]
    while os.path.dirname(out[-1]) != out[-1]:
        out.append(os.path.dirname(out[-1]))
    return out


def _banner(plan: LaunchPlan, opts: LaunchOptions) -> list[str]:
    devices = plan.devices
    script = plan.script
    if devices.kind == "cpu":
        threads = os.environ.get("OMP_NUM_THREADS") or plan.env.get("OMP_NUM_THREADS")
        backend = "(gloo)" if script is None else "(no GPU visible to them: gloo)"
        what = f"{plan.nproc_per_node} CPU worker(s) {backend}, {threads} thread(s) each"
    else:
        gpus = ",".join(str(i) for i in devices.gpu_indices)
        what = (f"1 worker on GPUs {gpus} (DataParallel)" if plan.nproc_per_node == 1 and len(devices.gpu_indices) > 1
                else f"{plan.nproc_per_node} GPU worker(s) on GPU(s) {gpus}")
    node = plan.node_rank if plan.node_rank is not None else "?"
    nodes = f", node {node} of {plan.nodes}" if plan.nnodes > 1 else ""
    if plan.nodes.elastic:
        nodes = f", node {node} of an elastic job of {plan.nodes.low} to {plan.nodes.high} nodes"
    job = f"; script {script.shown}" if script is not None else ""
    shown = {None: "local rank 0", "all": "every rank"}.get(opts.show_rank, f"local rank {opts.show_rank}")
    lines = [f"mgpu launch: {what}{nodes}{job}; run dir {plan.run_dir}",
             f"  logs of every rank: {plan.log_dir} ({shown} shown here); torchrun equivalent in "
             f"{plan.launch_json}"]
    if script is not None:
        lines.append(f"  {_hang_watch(opts.stall_s)}; Ctrl-C (or mgpu doctor {plan.run_dir} --stacks) shows where "
                     "every rank is")
    return lines + [f"  {note}" for note in plan.notes]


def _hang_watch(stall_s: float | None) -> str:
    from mgpucli.launch.stall_watch import DEFAULT_STALL_S

    if stall_s == 0:
        return "no stall watch (--stall-s 0)"
    if stall_s is None:
        return (f"a rank with no progress and no CPU work for {DEFAULT_STALL_S:g} s stops the job (--stall-s N: "
                "another limit, 0: none)")
    return f"a rank with no progress for {stall_s:g} s stops the job (--stall-s)"


_RESUME_GC_AFTER_S = 5.0


def _checked_plan(opts: LaunchOptions, nodes: JobNodes, dry_run: bool):
    """(the plan, the recipe, the gate with the recipe's check begun: None for a script or --dry-run). A recipe's
    launch composes it in a child process while a thread imports torch's agent (:mod:`mgpucli.launch.compose_child`):
    a recipe, an option or a ``_target_`` refused is said as soon as its check can tell, torch's agent imported or
    not (a ``_target_``'s check imports its module: torch's optimizers need torch, not the agent)."""
    composing = gate = None
    try:
        if opts.script is None and not dry_run:
            from mgpucli.launch.compose_child import Composing, Importing

            composing = Composing(opts.recipe, worker_overrides(opts))
            agent = Importing("mgpucli.launch.runner")  # torch's agent: what the launch needs next
        plan, cfg = _prepare(opts, nodes, claim_run_dir=not dry_run, deep=dry_run, composing=composing)
        if composing is not None:  # the recipe and the plan stand: their refusals did not wait for torch
            gate = _check_targets_now(cfg, opts, agent.settled)
            agent.wait()  # or until the targets' check refused
            if gate.error is not None:
                raise gate.refused()
        return plan, cfg, gate
    except BaseException:
        if gate is not None:
            gate.close()
        raise
    finally:
        if composing is not None:
            composing.close()


def launch(opts: LaunchOptions, dry_run: bool = False) -> int:
    """Run ``mgpu launch``; returns its exit code (UsageError for bad input, before anything the user sees starts)."""
    from mgpucli.heap import freeze_for_exit, postpone_full_gc, resume_full_gc

    if opts.stall_s is not None and not opts.stall_s >= 0:
        raise UsageError(f"--stall-s {opts.stall_s:g}: must be a number of seconds (0: no stall watch).",
                         "Example: --stall-s 300.")
    postpone_full_gc()  # until the workers start: see mgpucli/heap.py
    try:  # a recipe's launch checks the rest of it while its workers start (mgpucli/launch/gate.py)
        _check_options(opts)
        nodes = job_nodes(opts, os.environ)  # before torch is imported: a bad option is said at once
        plan, cfg, gate = _checked_plan(opts, nodes, dry_run)
    except BaseException:
        resume_full_gc()
        raise
    if dry_run:
        resume_full_gc()
        _print_banner(plan, opts)
        print(plan.command(), flush=True)
        return 0
    from mgpucli.run_records.launch_record import LaunchRecord

    if plan.nnodes > 1:  # compared with the other nodes' once they meet (mgpucli/launch/rendezvous_watch.py)
        plan.compared = compared_job(opts, plan, cfg)
    if gate is not None:
        gate.note(plan.run_dir)
        gate.note(plan.log_dir)
    _make_run_dir(plan.run_dir)
    record = LaunchRecord(_record_path(plan), record_header(plan, opts), final_path=plan.launch_json)
    if gate is None:
        _print_banner(plan, opts)
    else:
        _check_while_workers_start(gate, cfg, opts, plan, record)
    # Full collections resume once the workers are running and this process only watches them: resumed now, the
    # first one (over all of the start-up's objects) would land while torch's agent starts the workers.
    resume_gc_timer = threading.Timer(_RESUME_GC_AFTER_S, resume_full_gc)
    resume_gc_timer.daemon = True
    resume_gc_timer.start()
    try:
        code = _run(plan, opts, cfg, record, gate)
    finally:
        if gate is not None:
            gate.close()
    freeze_for_exit()  # only this process's exit is left: see mgpucli/heap.py
    return code


def compared_job(opts: LaunchOptions, plan: LaunchPlan, cfg) -> dict[str, str]:
    """What this node runs, item by item, as the nodes compare it (:mod:`mgpucli.launch.node_compare`): the recipe
    as composed and resolved (or the script, its arguments and its content), the options that change what the workers
    do, mgpu's and torch's versions."""
    import hashlib

    import torch

    from mgpucli.launch import node_compare

    script = plan.script
    if script is None:
        from omegaconf import OmegaConf

        try:
            recipe = OmegaConf.to_container(cfg, resolve=True)
        except Exception:  # noqa: BLE001 - a value only a worker can resolve: compared as written
            recipe = OmegaConf.to_container(cfg, resolve=False)
        job = node_compare.recipe_items(recipe)
    else:
        with open(check_target(script), "rb") as fh:
            job = node_compare.script_items(script.words(), hashlib.sha256(fh.read()).hexdigest())
    flag = script.local_rank_flag if script is not None else None
    options = {"--resume": opts.resume, "--overwrite": "given" if opts.overwrite else None,
               "--max-restarts": str(opts.max_restarts) if opts.max_restarts else None,
               "--probe-steps": str(opts.probe_steps) if opts.probe_steps is not None else None,
               "--audit": "given" if script is not None and script.audit else None, "--local-rank-arg": flag}
    return node_compare.job_items(job, options, {"mgpu": __version__, "torch": torch.__version__})


def _run(plan: LaunchPlan, opts: LaunchOptions, cfg, record, gate) -> int:
    """Run the job through torch's agent, then tell how it ended."""
    from mgpucli.console import err_console
    from mgpucli.launch.runner import run_plan

    stall_s = opts.stall_s if opts.stall_s is not None else (cfg.trainer.stall_s if cfg is not None else None)
    code = run_plan(plan, record, live=sys.stderr.isatty(), show_rank=opts.show_rank, stall_s=stall_s, gate=gate)
    if record.result.status in ("failed", "stalled"):  # end with the post-mortem (mgpu doctor RUN_DIR)
        from mgpucli.postmortem import after_launch_failure

        after_launch_failure(os.path.dirname(record.path) if not record.promoted else plan.run_dir)
    if not record.promoted:
        err_console().print(
            f"mgpu launch: no worker started {'the script' if plan.script else 'training'}, so {plan.run_dir}'s "
            f"records of its earlier run are untouched; this launch's record: {record.path}", markup=False,
            highlight=False)
    return code


def _print_banner(plan: LaunchPlan, opts: LaunchOptions) -> None:
    from mgpucli.console import err_console

    for line in _banner(plan, opts):
        err_console().print(line, markup=False, highlight=False)


def _check_while_workers_start(gate, cfg, opts: LaunchOptions, plan: LaunchPlan, record) -> None:
    """The rest of the recipe's check (:func:`_deep_check`), run by ``gate`` as torch's agent starts the workers,
    which wait for its verdict: the targets at once (a refusal found before the agent starts a worker starts none),
    then local rank 0's builds. The composed recipe is handed to the workers at once (local rank 0 builds its
    components for the check; every worker trains it after ``go``). On ``go``: the launch record written, the
    banner. On a refusal: the workers killed, torch's agent quiet about it (the check's error is what the user
    sees)."""
    from mgpucli.config import handoff
    from mgpucli.launch import gate as verdict

    os.environ[verdict.ENV] = gate.path
    os.environ.pop(handoff.ENV, None)
    with contextlib.suppress(OSError):  # else the workers compose the recipe themselves, as under torchrun
        os.environ[handoff.ENV] = str(handoff.write(cfg, opts.recipe, worker_overrides(opts), plan.log_dir))

    def go() -> None:
        record.write()
        _print_banner(plan, opts)

    gate.check(lambda: gate.builds_checked(opts.recipe), go, _end_workers)


def record_header(plan: LaunchPlan, opts: LaunchOptions, argv: list[str] | None = None) -> LaunchHeader:
    """What ``launch.json`` says about this launch before any worker starts (``argv``: the command line after
    ``mgpu``, default this process's). A script's launch says so (``job``) and names it (``script``)."""
    script = plan.script
    return LaunchHeader(
        mgpu_version=__version__,
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        host=socket.gethostname(),
        pid=os.getpid(),
        cwd=os.getcwd(),
        argv=["mgpu", *(sys.argv[1:] if argv is None else argv)],
        job=plan.job,
        recipe=opts.recipe if script is None else None,
        overrides=list(opts.overrides) if script is None else [],
        script=None if script is None else ScriptJob(
            path=script.path, module=script.module, args=list(script.args),
            local_rank_flag=script.local_rank_flag, audit=script.audit,
        ),
        run_dir=plan.run_dir,
        devices=Devices(kind=plan.devices.kind, nproc_per_node=plan.nproc_per_node,
                        gpu_indices=list(plan.devices.gpu_indices),
                        cuda_visible_devices=plan.devices.cuda_visible_devices),
        nnodes=plan.nnodes,
        nnodes_min=plan.nnodes_min,
        node_rank=plan.node_rank,
        rendezvous=RendezvousInfo(backend=plan.rdzv_backend, endpoint=plan.rdzv_endpoint, id=plan.rdzv_id),
        max_restarts=opts.max_restarts,
        torchrun=plan.command(),
        torchrun_args=list(plan.torchrun_args),
        notes=list(plan.notes),
        set_by_mgpu=dict(plan.env),
        log_dir=plan.log_dir,
    )


def _record_path(plan: LaunchPlan) -> str:
    """Where this launch's record goes until its training starts: the run dir's own ``launch.json`` when the run dir
    holds no earlier run; else a folder of its own in the log dir, so that a launch that fails before training never
    replaces the earlier run's records (:meth:`~mgpucli.run_records.launch_record.LaunchRecord.promote` moves it
    once training starts)."""
    if not holds_a_run(plan.run_dir):
        return plan.launch_json
    return os.path.join(plan.log_dir, f"{LAUNCH_DIR_PREFIX}{plan.rdzv_id}", os.path.basename(plan.launch_json))
