"""``mgpu launch``: one worker per GPU (or N CPU workers) through torch's own launcher engine.

Modules, lightest first (only ``runner`` imports torch):

- ``plan``: options + recipe facts + machine -> torchrun argument list (pure, unit-tested)
- ``slurm``, ``ports``: SLURM variables and port checks used by the plan
- ``restart``, ``records``: resume-on-restart and the "this failure would repeat" rule
- ``index``, ``failures``: ``launch.json`` and the failure summary
- ``watch``, ``worker``: the worker side (die with the launcher; failure records)
- ``runner``: torch's elastic agent, configured from the plan; ``main``: the command's flow
"""
