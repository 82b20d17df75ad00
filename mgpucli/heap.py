"""Memory behaviour of mgpu's processes (stdlib only; the CLI, the launcher and the engine use it).

A steady C heap for training processes: glibc's malloc thresholds fixed at the values it converges to.

glibc's malloc adapts two thresholds as a process runs: blocks above ``M_MMAP_THRESHOLD`` get their own
``mmap``, and free memory above ``M_TRIM_THRESHOLD`` at the top of the heap is given back to the kernel. Both
start at 128 KiB and rise (to at most 32 MiB and 64 MiB) only when the process happens to free a large
mmapped block. A training step allocates and frees the same few MiB of activations and gradients every
step; with thresholds that stayed low, the heap is trimmed at the end of each step and grown again in the
next, and every page of it is faulted in and zeroed again.

So mgpu fixes both thresholds from the start at glibc's own maxima (mmap above 32 MiB, trim above 64 MiB):
the heap stops being trimmed and faulted in again every step (on the char LM recipe that cycle cost a few
percent of step time). A process that trains needs the same memory again a step later, so keeping it costs
nothing in peak RSS.

A user's own ``MALLOC_*_`` settings (or another allocator through ``LD_PRELOAD``) win: mgpu then leaves malloc
alone.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import sys

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc sets when it raises the mmap threshold itself
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                 "GLIBC_TUNABLES", "LD_PRELOAD")


def steady_heap() -> bool:
    """Fix glibc's trim and mmap thresholds for this process; True when done (Linux with glibc, and no
    malloc settings or preloaded allocator of the user's)."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(os.environ.get(name) for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


# ------------------------------------------------------------------------------------ Python's cyclic GC
# A worker's start-up (torch, its dynamo/sympy imports, the recipe, the components) creates a few hundred thousand
# objects that live as long as the process. CPython runs a full (generation 2) collection each time the long-lived
# objects grow by a quarter, and each one walks all of them: several collections, most of a second of start-up.
# Instead, mgpu postpones full collections until the trainer is set up (young objects are still collected as usual)
# and then freezes what is there (gc.freeze): no later collection walks the start-up's objects again. A full
# collection at that point would delay the first step, so the start-up's garbage cycles (small) wait in the frozen
# generation until the teardown unfreezes and collects everything (engine/run.py). ``mgpu launch`` postpones full
# collections too, until its workers are running.
_START_UP_GEN2_THRESHOLD = 1 << 30  # generation-2 runs after this many generation-1 runs: not during start-up
_DEFAULT_GEN2_THRESHOLD = 10  # CPython's


def postpone_full_gc() -> None:
    """From here until :func:`settle_gc`, no full collections (generations 0 and 1 run as usual)."""
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, _START_UP_GEN2_THRESHOLD)


def resume_full_gc() -> None:
    """Full collections as CPython schedules them again, without running one now: for a process whose next
    phase is mostly waiting (``mgpu launch`` once its workers start), where a later collection costs nothing."""
    gen0, gen1, gen2 = gc.get_threshold()
    if gen2 == _START_UP_GEN2_THRESHOLD:
        gc.set_threshold(gen0, gen1, _DEFAULT_GEN2_THRESHOLD)


def freeze_for_exit() -> None:
    """The process's work is done and only the interpreter's exit is left: freeze every object, so that the exit's
    final collections walk none of them (the kernel frees the memory). With torch and its dynamo imported, those
    collections are most of a second of a launcher's or a worker's exit (2 s of 2.4 s, measured on a loaded
    2-core machine), which the whole job waits for. Only objects already unreachable when this runs and caught in
    cycles lose their finalizers: call it once files are closed and the job's resources released."""
    gc.freeze()


def settle_gc() -> None:
    """End of start-up: freeze what is there, then full collections as CPython schedules them (of what comes
    after). The caller unfreezes and collects at its teardown."""
    if gc.get_threshold()[2] != _START_UP_GEN2_THRESHOLD:
        return  # not postponed (mgpu's engine driven from Python): leave the caller's GC alone
    gc.freeze()
    resume_full_gc()
