"""Turn the raw errors of a failing job into messages that name the rank, the place and the fix."""

from __future__ import annotations

import re

from mgpucli.distributed.heartbeat import Heartbeat, describe, late_ranks
from mgpucli.errors import JobFailed

_TIMEOUT = re.compile(r"Timed out waiting|timed out|Timeout|timeout|pair closure|Socket Timeout", re.I)
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|NCCL communicator was aborted")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return re.sub(r"^\[[^\]]*\]\s*", "", text[0]) if text else type(err).__name__


def is_collective_failure(err: BaseException) -> bool:
    """Whether ``err`` is a collective that timed out or lost its connection to another rank (a peer died)."""
    text = str(err)
    return isinstance(err, RuntimeError) and bool(_TIMEOUT.search(text) or _PEER_GONE.search(text))


def collective_failure(err: BaseException, heartbeat: Heartbeat, timeout_s: int) -> JobFailed | None:
    """A timed-out or broken collective: which one, at which step, and which ranks had not arrived."""
    text = str(err)
    timed_out, peer_gone = bool(_TIMEOUT.search(text)), bool(_PEER_GONE.search(text))
    if not (timed_out or peer_gone) or heartbeat.world_size <= 1:
        return None
    seen = heartbeat.others()
    me = next(s for s in seen if s.rank == heartbeat.rank)
    late = late_ranks(seen, me)
    where = f"'{me.phase}' at step {me.step}"
    late_text = "; ".join(describe(s) for s in late) if late else "none identified"
    if timed_out:
        return JobFailed(
            f"rank {heartbeat.rank}: a collective timed out after trainer.timeout_s={timeout_s} s in {where}. "
            f"Ranks that had not arrived: {late_text}. (gloo/nccl said: {_first_line(err)})",
            f"If a rank legitimately needs longer there (a long validation, checkpoint or first-step compile), "
            f"raise trainer.timeout_s (e.g. trainer.timeout_s={timeout_s * 4}); otherwise look at the late "
            "rank's log for what it was stuck on.",
            retryable=True,  # this rank waited for another: its message names phases ("NaN check"), not a NaN
        )
    return JobFailed(
        f"rank {heartbeat.rank}: lost its connection to another rank in {where}: a peer died or was killed. "
        f"Ranks not where this one was: {late_text}.",
        "The failing rank's own log has the cause (mgpu launch names it); this rank only saw the aftermath.",
        retryable=True,  # an echo of a peer's failure; whether that one repeats decides a restart
    )


def out_of_memory(err: BaseException, rank: int, step: int, batch_size: int) -> JobFailed:
    return JobFailed(
        f"rank {rank} ran out of GPU memory at step {step}: {_first_line(err)}",
        f"Lower data.batch_size (now {batch_size}) and raise trainer.grad_accum to keep the global batch, use "
        "trainer.precision=bf16, or shard the model with trainer.strategy=fsdp.",
    )


def translate(err: BaseException, heartbeat: Heartbeat | None, rank: int, step: int, timeout_s: int,
              batch_size: int) -> JobFailed | None:
    """A clearer JobFailed for known failures, or None to let the original error (a bug) show."""
    import torch

    if isinstance(err, torch.OutOfMemoryError):
        return out_of_memory(err, rank, step, batch_size)
    if heartbeat is not None and isinstance(err, RuntimeError):
        return collective_failure(err, heartbeat, timeout_s)
    return None
