"""mgpu's steady heap: a process that frees and reallocates the same memory every step stops faulting it in."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

glibc_only = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc malloc only")

CHURN = """
import resource, sys
from mgpucli.heap import steady_heap
applied = steady_heap() if sys.argv[1] == "steady" else None
def steps(n):  # a 'step' allocates 2 MiB in 100 KiB blocks (below glibc's initial mmap threshold) and frees it
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        blocks = [bytearray(100 << 10) for _ in range(20)]
        del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
steps(2)
print(applied, steps(50))
"""


def _faults(mode: str, **env: str) -> tuple[str, int]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, timeout=60,
                         env={**full_env, **env})
    assert out.returncode == 0, out.stderr
    applied, faults = out.stdout.split()
    return applied, int(faults)


@glibc_only
def test_steady_heap_stops_the_trim_and_refault_cycle():
    _, default = _faults("default")
    applied, steady = _faults("steady")
    assert applied == "True"
    assert default > 5000  # glibc as it starts: the 2 MiB is trimmed and faulted in again every step
    assert steady < default / 20


@glibc_only
def test_the_users_own_malloc_settings_win():
    applied, faults = _faults("steady", MALLOC_TRIM_THRESHOLD_="131072")
    assert applied == "False" and faults > 5000


GC_STARTUP = """
import gc, sys
from mgpucli.heap import postpone_full_gc, settle_gc
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
if sys.argv[1] == "postponed":
    postpone_full_gc()
keep = [[{} for _ in range(10)] for _ in range(30000)]  # a start-up's worth of long-lived objects
during = len(full)
settle_gc()
frozen = gc.get_freeze_count()
gc.unfreeze()  # what a worker's teardown does
print(during, frozen >= 30000, gc.get_threshold()[2])
"""


def _startup(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", GC_STARTUP, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_full_collections_wait_for_the_end_of_start_up_which_is_then_frozen():
    assert _startup("default")[0] != "0"  # CPython walks the growing heap again and again
    during, frozen, threshold = _startup("postponed")
    assert (during, frozen, threshold) == ("0", "True", "10")


def test_settle_leaves_a_gc_it_did_not_postpone_alone():
    _, frozen, threshold = _startup("default")
    assert (frozen, threshold) == ("False", "10")


WORKER_EXIT = """
import atexit, gc, sys
from mgpucli.launch import worker
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 1000, flush=True))  # runs after the job
worker.main(["script", sys.argv[1]])
"""


def test_a_worker_leaves_its_heap_frozen_for_the_exit(tmp_path):
    """Once its job is over, a worker's exit does not walk torch's objects again (mgpucli.heap.freeze_for_exit)."""
    script = tmp_path / "job.py"
    script.write_text("import torch\nprint('trained')\n")
    out = subprocess.run([sys.executable, "-c", WORKER_EXIT, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["trained", "frozen at exit: True"]


RECIPE_WORKER_START = """
import gc
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
from mgpucli.engine import train_entry
from mgpucli.launch import worker
train_entry.train_recipe = lambda *args, **kwargs: print("full collections:", len(full), flush=True)
worker.RecipeJob("recipe.yaml").run()  # imports torch, its dynamo and the engine, then 'trains'
"""


def test_a_recipe_workers_imports_run_no_full_collection(tmp_path):
    """A launched worker imports torch and the engine before the launcher's verdict: with full collections postponed
    from its first line (mgpucli/heap.py), none walks torch's growing heap (CPython would run several)."""
    out = subprocess.run([sys.executable, "-c", RECIPE_WORKER_START], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={k: v for k, v in os.environ.items() if not k.startswith("MGPU_")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "full collections: 0"
