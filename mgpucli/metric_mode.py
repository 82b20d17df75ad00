"""Which way a metric improves (stdlib only): ``trainer.best_mode``'s ``auto``, said once.

The engine picks ``best.pt`` and decides early stopping with it (:mod:`mgpucli.engine.checkpoints.training`,
:mod:`mgpucli.engine.early_stopping`); ``mgpu runs`` ranks runs by their best validation metric with it
(:mod:`mgpucli.postmortem.run_summary`), without importing torch.
"""

from __future__ import annotations

LOWER_IS_BETTER = ("loss", "perplexity", "mse", "mae", "error")


def resolve_mode(metric: str, mode: str) -> str:
    """``auto``: ``min`` for loss-like names (loss, perplexity, mse, mae, error), ``max`` otherwise."""
    if mode != "auto":
        return mode
    return "min" if any(word in metric for word in LOWER_IS_BETTER) else "max"
