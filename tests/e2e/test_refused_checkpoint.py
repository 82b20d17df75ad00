"""A checkpoint whose pickle would run code is refused, naming what it would call; nothing of it runs."""

from __future__ import annotations

import os

import torch

from tests.procs import assert_usage_error, mgpu


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_validate_names_the_call_an_untrusted_checkpoint_would_make(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"model": _RunsCode(marker)}, tmp_path / "evil.pt")
    r = mgpu("validate", "evil.pt", cwd=tmp_path, timeout=120)
    assert_usage_error(r, "refused to load evil.pt: the checkpoint would call os.system from the file",
                       "Nothing from it was executed")
    assert not marker.exists()
