"""What a rank says when its script starts distributed processes of its own (stdlib only): the launched worker
raises it (:mod:`mgpucli.launch.nested`), the post-mortem recognises it in the logs."""

from __future__ import annotations

ERROR_NAME = "NestedLaunchError"
FIX = ("Let one launcher start the processes. Either mgpu: drop the script's own spawning (its flag for it, such as "
       "--multiprocessing-distributed) and keep mgpu launch --gpus N (or --cpu --nproc N); or the script: give it "
       "one mgpu worker, mgpu launch --nproc 1 (with --cpu) or --gpus 1 (it then sees that one GPU), and let it "
       "spawn.")


def message(rank: int, world_size: int, what: str) -> str:
    """The error's text: what happened, then :data:`FIX`."""
    return (f"the script starts its own distributed processes ({what}) in rank {rank} of the {world_size} that mgpu "
            f"launch already started: two launchers on one rendezvous, which hangs. {FIX}")
