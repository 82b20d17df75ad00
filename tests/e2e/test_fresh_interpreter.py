"""What a module pulls in, seen from a fresh interpreter: stdlib-only helpers stay light.

Each test runs a small script in a child Python, since the test process itself has torch & co. loaded.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mgpucli.engine.checkpoints.files import save_atomic
from tests.procs import REPO
from tests.unit.test_postmortem_checkpoint import real_payload


def test_cpus_imports_no_torch():
    code = "import sys, mgpucli.cpus; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False"


def test_writing_events_imports_no_tensorboard(tmp_path):
    code = ("import sys; from mgpucli.engine.rundir import MetricsWriter; from pathlib import Path; "
            "w = MetricsWriter(Path(sys.argv[1])); w.write({'split': 'train', 'step': 1, 'loss': 1.0}); w.close(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'google')))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_reading_a_checkpoints_step_does_not_import_torch(tmp_path: Path):
    path = tmp_path / "last.pt"
    save_atomic(real_payload(step=12, epoch=1), path)
    code = ("import sys; from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info as r; "
            f"i = r({str(path)!r}); print(i.step, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["12", "False"]


def test_dcp_is_imported_at_the_first_save_not_with_the_trainer():
    code = textwrap.dedent("""
        import sys, torch
        from torch import nn
        import mgpucli.engine.trainer
        from mgpucli.engine.checkpoints import state as st
        def loaded():
            return any(k.startswith("torch.distributed.checkpoint") for k in sys.modules)
        print(loaded())
        m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        opt = torch.optim.AdamW(m.parameters(), lr=0.01)
        m(torch.randn(8, 4)).sum().backward()
        opt.step()
        model, optim = st.model_state(m), st.optimizer_state(m, opt)
        print(len(model), len(optim["state"]), loaded())
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["False", "9 6 True"], out.stdout
