"""The names of the environment variables mgpu reads or sets across its layers, each said once (stdlib only).

A variable that one module alone reads and writes keeps its name there (``config.handoff.ENV``,
``launch.progress_file.ENV``, ``faults``' ``MGPU_FAULT*``); the ones read in several places live here.
"""

from __future__ import annotations

RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # which start of the worker group (mgpu launch: every one on this node)
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # torch's agent: where this worker's error file goes
USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # torch's agent: the workers share its rendezvous store
LOG_LINE_PREFIX = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"  # torch's agent: the prefix of every rank's lines
RUN_DIR = "MGPU_RUN_DIR"  # mgpu launch: the run dir, for the workers (a script may write there)
LAUNCH_PID = "MGPU_LAUNCH_PID"  # mgpu launch: the launcher's pid, which every worker watches
ELASTIC_GLOBAL_BATCH = "MGPU_ELASTIC_GLOBAL_BATCH"  # mgpu launch --nnodes MIN:MAX: the global batch a recipe keeps
CONTINUES = "MGPU_CONTINUES"  # mgpu launch: "1" when this start continues a job that already ran (resume from it)
