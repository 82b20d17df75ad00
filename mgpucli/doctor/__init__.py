"""``mgpu doctor``: will this machine train, and if not, why and how to fix it.

Layout (the doctor process itself never imports torch; torch runs in bounded child processes):

- ``observation``: plain dataclasses holding what was seen (env, torch, nvidia-smi, host).
- ``gather`` (+ ``probe_torch``, ``smi``, ``host``): fill an Observation; every probe that can
  hang runs in a child process with a timeout.
- ``checks_*``: pure functions ``Observation -> CheckResult``; unit-tested with faked observations.
- ``live`` (+ ``live_worker``): the live collective test through torch's launcher engine.
- ``report``: run everything, pick the verdict. Rendering is the CLI's job.
"""
