"""``mgpu launch``: one worker per GPU (or N CPU workers) through torch's own launcher engine.

The launcher's side, lightest first (only ``runner`` imports torch):

- ``plan``: options + recipe facts + machine -> torchrun argument list (pure, unit-tested);
  ``job_source``: which engine describes the job (SLURM via ``slurm``, torchrun's ``PET_*``, a Kubernetes pod's
  variables); ``ports``: port and host checks used by the plan; ``script``: a user's own script as the
  job (its target and checks, the legacy --local_rank spelling, its run dir)
- ``main``: the command's flow (check the recipe once, plan, run, end a failure with the post-mortem);
  ``compose_child``: the recipe composed in a child process while the launcher imports torch's agent
- ``runner``: torch's elastic agent in this process, configured from the plan; records every attempt in
  ``launch.json`` (:mod:`mgpucli.run_records`)
- ``restart``: resume-on-restart and the "this failure would repeat" rule
- ``failure_summary``: what a failed launch prints; ``live_view``: rank 0's output and a progress bar on a terminal
- ``spawn``: a short mgpu command on N local workers (``mgpu validate``)

The workers' side (never imports mgpu's CLI, typer or rich):

- ``worker``: ``python -m mgpucli.launch.worker JOB ...``, the job run as this rank inside the launcher's rules;
  ``script_job``: the job that runs a user's script as ``python`` would
- ``parent_watch``: a worker dies with its launcher; ``progress_file``: rank 0's progress for the live view

Processes are started and killed through :mod:`mgpucli.proctree`.
"""
