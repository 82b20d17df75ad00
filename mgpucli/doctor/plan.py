"""Which processes the doctor checks the machine for, from ``--gpus`` / ``--cpu --nproc``.

Two kinds of problem, kept apart on purpose:
- options that make no sense anywhere (``--cpu --gpus 2``, ``--nproc`` without ``--cpu``, ``--gpus x``) are
  usage errors: exit 2 before anything runs;
- a selection this machine cannot satisfy (``--gpus 4`` with 2 GPUs visible, a broken CUDA_VISIBLE_DEVICES)
  is a finding: the 'device selection' check fails with the reason, and every other check still runs, since
  they often show the cause (say, a CUDA_VISIBLE_DEVICES left in the shell).

Without options: every visible GPU; on a machine where torch sees no GPU, 2 CPU processes (gloo), so that
torch.distributed itself is still tested (the smallest job with a real collective). ``--cpu`` alone also
means 2 processes, for the same reason (``--cpu --nproc 1`` checks a single process).
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpucli.distributed.cuda_visible import parse_cuda_visible_devices
from mgpucli.distributed.select import parse_gpus, select_devices
from mgpucli.doctor.observation import Plan
from mgpucli.errors import UsageError

CPU_FALLBACK_NPROC = 2


@dataclass(frozen=True)
class DeviceOptions:
    """The doctor's device options as given on the command line."""

    gpus: str | None = None
    cpu: bool = False
    nproc: int | None = None

    def validate(self) -> None:
        """UsageError for combinations that are wrong on any machine."""
        if self.cpu and self.gpus is not None:
            raise UsageError("--cpu and --gpus exclude each other.", "Pick one: --gpus N for GPUs, --cpu --nproc N.")
        if self.nproc is not None and not self.cpu:
            raise UsageError(
                "--nproc sets the number of CPU processes and needs --cpu.",
                "For GPUs use --gpus N (one process per GPU); for CPUs use --cpu --nproc N.",
            )
        if self.nproc is not None and self.nproc < 1:
            raise UsageError(
                f"--nproc {self.nproc}: the process count must be at least 1.", "Example: --cpu --nproc 2."
            )
        if self.gpus is not None:
            wanted = parse_gpus(self.gpus)  # raises on syntax
            if isinstance(wanted, int) and wanted < 1:
                raise UsageError(f"--gpus {wanted}: the GPU count must be at least 1.", "Example: --gpus 2.")
            if isinstance(wanted, tuple) and (not wanted or min(wanted) < 0 or len(set(wanted)) < len(wanted)):
                raise UsageError(
                    f"--gpus {self.gpus!r} must list each GPU index (0, 1, ...) once.", "Example: --gpus 0,2,3."
                )


def make_plan(opts: DeviceOptions, visible_count: int, cuda_visible_raw: str | None) -> Plan:
    """The selection to check; a Plan with ``kind=None`` and the reason when this machine cannot run it."""
    if opts.cpu:
        nproc = opts.nproc or CPU_FALLBACK_NPROC  # 1 process would test no real collective
        sel = select_devices(None, True, nproc, visible_count, cuda_visible_raw)
        return Plan(kind="cpu", nproc=sel.nproc)
    if opts.gpus is not None:
        try:
            sel = select_devices(opts.gpus, False, None, visible_count, cuda_visible_raw)
        except UsageError as err:
            return Plan(kind=None, error=err.message, hint=err.hint or "")
        return Plan("cuda", sel.nproc, sel.gpu_indices, sel.cuda_visible_devices)
    if visible_count == 0:
        note = "no GPU visible to torch, so CPU processes are checked (--gpus insists on GPUs)"
        return Plan(kind="cpu", nproc=CPU_FALLBACK_NPROC, note=note)
    if parse_cuda_visible_devices(cuda_visible_raw).problems:
        # The CUDA_VISIBLE_DEVICES check reports the problem; check what torch sees now, as it is.
        return Plan("cuda", visible_count, tuple(range(visible_count)), None, note="every GPU torch sees now")
    sel = select_devices(None, False, None, visible_count, cuda_visible_raw)
    return Plan("cuda", sel.nproc, sel.gpu_indices, sel.cuda_visible_devices)
