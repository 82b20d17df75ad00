"""The names of the environment variables mgpu reads or sets across its layers, each said once (stdlib only).

A variable that one module alone reads and writes keeps its name there (``config.handoff.ENV``,
``launch.progress_file.ENV``, ``faults``' ``MGPU_FAULT*``); the ones read in several places live here.
"""

from __future__ import annotations

# A process's role in the job, as torchrun sets it for each worker. One place reads a process's own role:
# mgpucli.distributed.env (the audit reads the user's script's role itself, the test-only faults read RANK);
# tests/unit/test_one_place.py lists the others that handle these names and why.
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ROLE = (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE)

RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # which start of the worker group (mgpu launch: every one on this node)
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # torch's agent: where this worker's error file goes
RUN_ID = "TORCHELASTIC_RUN_ID"  # torch's agent: the job's rendezvous id, for each worker it starts
USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # torch's agent: the workers share its rendezvous store
LOG_LINE_PREFIX = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"  # torch's agent: the prefix of every rank's lines
RUN_DIR = "MGPU_RUN_DIR"  # mgpu launch: the run dir, for the workers (a script may write there)
LAUNCH_PID = "MGPU_LAUNCH_PID"  # mgpu launch: the launcher's pid, which every worker watches
ELASTIC_GLOBAL_BATCH = "MGPU_ELASTIC_GLOBAL_BATCH"  # mgpu launch --nnodes MIN:MAX: the global batch a recipe keeps
CONTINUES = "MGPU_CONTINUES"  # mgpu launch: "1" when this start continues a job that already ran (resume from it)
# The cluster engines' variables: their names are read in mgpucli.launch.job_source and mgpucli.launch.slurm; the
# prefixes here are what the launch record keeps and what the doctor's live test leaves out of its launcher's shell.
PET_PREFIX = "PET_"  # torchrun: every option's default is PET_<OPTION> (torch/distributed/argparse_util.py)
SLURM_PREFIX = "SLURM_"
NO_STALL_WATCH = "MGPU_NO_STALL_WATCH"  # mgpu launch --stall-s 0: a script's workers wrap only what the job needs
