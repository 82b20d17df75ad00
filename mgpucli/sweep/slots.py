"""Where a sweep's trials run: the devices it may use, cut into slots, one trial per slot at a time (pure: the visible
GPU count and the usable cores are passed in).

GPUs: ``--gpus`` as ``mgpu launch`` takes it (a count, a list, ``all``), in groups of ``--gpus-per-run``: 8 GPUs in
groups of 2 are 4 slots, and no two trials ever share a GPU. CPUs: ``--parallel`` slots of ``--nproc-per-run`` gloo
processes each, every process given an equal share of the usable cores as its threads.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpucli.distributed.select import select_devices
from mgpucli.errors import UsageError


@dataclass(frozen=True)
class Slot:
    """One place a trial runs: its GPUs (indices among the visible ones), or CPU processes."""

    index: int
    gpus: tuple[int, ...] = ()  # empty: a CPU slot
    nproc: int = 1

    def launch_args(self) -> list[str]:
        """``mgpu launch``'s device options for a trial in this slot."""
        if not self.gpus:
            return ["--cpu", "--nproc", str(self.nproc)]
        return ["--gpus", ",".join(str(g) for g in self.gpus) + ("," if len(self.gpus) == 1 else "")]

    def describe(self) -> str:
        if not self.gpus:
            return f"cpu{self.index}"
        return "gpu " + ",".join(str(g) for g in self.gpus)


@dataclass(frozen=True)
class Slots:
    """The sweep's slots, the threads each CPU process gets (None on GPUs), and what is left idle, said."""

    slots: tuple[Slot, ...]
    cpu_threads: int | None = None
    note: str | None = None  # e.g. "GPU 3 stays idle: 4 GPUs in groups of 3"


@dataclass(frozen=True)
class DeviceOptions:
    """The sweep's device options as given (None: not given)."""

    gpus: str | None = None
    gpus_per_run: int | None = None
    cpu: bool = False
    nproc_per_run: int | None = None
    parallel: int | None = None


def plan(opts: DeviceOptions, visible_gpus: int, cores: int, cuda_visible_raw: str | None = None) -> Slots:
    """The slots the options ask for on this machine; UsageError (exit 2) for options that don't fit together or
    ask for more than there is."""
    if opts.cpu:
        return _cpu_slots(opts, cores)
    for given, option in ((opts.nproc_per_run, "--nproc-per-run"), (opts.parallel, "--parallel")):
        if given is not None:
            raise UsageError(f"{option} is for CPU trials and needs --cpu.",
                             "On GPUs, --gpus-per-run K gives each trial K GPUs and runs as many trials at once as "
                             "there are groups of K.")
    selection = select_devices(opts.gpus, False, None, visible_gpus, cuda_visible_raw)
    per_run = 1 if opts.gpus_per_run is None else opts.gpus_per_run
    devices = selection.gpu_indices
    if per_run < 1:
        raise UsageError(f"--gpus-per-run {per_run}: a trial needs at least one GPU.", "Example: --gpus-per-run 2.")
    if per_run > len(devices):
        raise UsageError(f"--gpus-per-run {per_run} asks for more GPUs than the sweep has ({len(devices)}: "
                         f"{_listed(devices)}).", f"Give each trial at most {len(devices)} (--gpus-per-run), or "
                         "the sweep more (--gpus).")
    count = len(devices) // per_run
    slots = tuple(Slot(i, devices[i * per_run:(i + 1) * per_run]) for i in range(count))
    idle = devices[count * per_run:]
    note = None
    if idle:
        note = (f"GPU {_listed(idle)} stay(s) idle: {len(devices)} GPUs make {count} group(s) of {per_run} "
                f"(--gpus-per-run); give the sweep {count * per_run} or {(count + 1) * per_run} GPUs to use them all.")
    return Slots(slots, None, note)


def _cpu_slots(opts: DeviceOptions, cores: int) -> Slots:
    for given, option in ((opts.gpus, "--gpus"), (opts.gpus_per_run, "--gpus-per-run")):
        if given is not None:
            raise UsageError(f"{option} asks for GPUs, but --cpu runs the trials on CPUs.",
                             "Drop it (and give --nproc-per-run N --parallel P), or drop --cpu.")
    nproc = 1 if opts.nproc_per_run is None else opts.nproc_per_run
    parallel = 1 if opts.parallel is None else opts.parallel
    for value, option in ((nproc, "--nproc-per-run"), (parallel, "--parallel")):
        if value < 1:
            raise UsageError(f"{option} {value}: it must be at least 1.", f"Example: {option} 2.")
    processes = nproc * parallel
    note = None
    if processes > cores:
        note = (f"{parallel} trial(s) x {nproc} process(es) = {processes} processes on {cores} usable core(s): each "
                "gets one thread, and they share the cores.")
    return Slots(tuple(Slot(i, (), nproc) for i in range(parallel)), max(1, cores // processes), note)


def _listed(gpus: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in gpus)
