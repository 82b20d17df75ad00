"""Fixtures the unit modules share (pytest finds them here; no test module imports another's fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from mgpucli.audit.session import Session


@pytest.fixture
def ranks(tmp_path: Path):
    """``ranks(n)``: n sessions of one job (rank 0..n-1, one node) sharing a store, each with its findings file."""
    store = dist.HashStore()

    def make(n: int = 2, local_world_size: int | None = None) -> list[Session]:
        out = []
        for rank in range(n):
            (tmp_path / str(rank)).mkdir(exist_ok=True)
            env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
                   "LOCAL_WORLD_SIZE": str(local_world_size or n), "TORCHELASTIC_RUN_ID": "test",
                   "TORCHELASTIC_ERROR_FILE": str(tmp_path / str(rank) / "error.json")}
            out.append(Session(env, store_factory=lambda: store))
        return out

    return make
