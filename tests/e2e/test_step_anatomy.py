"""Where each rank's step time goes, for real: 2 CPU workers (gloo), one of them slow to load its data, or neither.
The straggler is named on the terminal and by `mgpu doctor RUN_DIR`; a run without one names nobody."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.test_launch import run_launch
from tests.inproc import cli

HERE = Path(__file__).parent
# 30 steps of 8 samples per rank, a record every 5: rank 1's 20 ms per item is 160 ms per step
SHORT = ["data.batch_size=8", "trainer.max_steps=30", "trainer.log_every=5", "data.val=null",
         "trainer.best_metric=null", "data.num_workers=0", "run_dir=run", "trainer.anatomy=true"]
PHASES = ("data", "compute", "comm", "optimizer", "other")


def _launch(tmp_path: Path, tag: str, *extra: str):
    code, launch = run_launch(["--cpu", "--nproc", "2", "quickstart", *SHORT, *extra], tmp_path, tag, timeout=150)
    assert code == 0, launch.output
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("split") == "train"]
    assert [r["step"] for r in train] == [5, 10, 15, 20, 25, 30]
    for record in train:  # every interval holds both ranks' figures
        assert len(record["anatomy"]) == 2
        for rank in record["anatomy"]:
            assert rank["step_s"] > 0 and sum(rank[p] for p in PHASES) == pytest.approx(1.0)
    doctor = cli("doctor", "run", "--json", cwd=tmp_path)  # reads the run dir: in this process
    assert doctor.returncode == 0, doctor.output
    return launch.output, train, json.loads(doctor.stdout)["straggler"]


def test_a_rank_slow_to_load_its_data_is_named_with_the_fix(tmp_path: Path, tag: str):
    shutil.copy(HERE / "slow_data.py", tmp_path)
    output, train, straggler = _launch(tmp_path, tag, "data.train._target_=slow_data.SlowOnRank")
    assert "straggler: rank 1 waits for data" in output and "raise data.num_workers (now 0)" in output, output
    assert (straggler["rank"], straggler["cause"]) == (1, "data")
    for record in train[1:]:  # rank 0 waits for rank 1 in the gradients' all-reduce more than it does anything else
        mine = record["anatomy"][0]
        assert mine["comm"] == max(mine[p] for p in PHASES), record
    shown = cli("doctor", "run", cwd=tmp_path)
    assert "straggler: rank 1 waits for data" in shown.stderr and "data.num_workers (now 0)" in shown.stderr


def test_balanced_ranks_name_nobody(tmp_path: Path, tag: str):
    output, _, straggler = _launch(tmp_path, tag)
    assert "straggler" not in output and straggler is None, output


def test_a_scripts_slow_loader_on_rank_1_is_named_under_audit(tmp_path: Path, tag: str):
    script = HERE / "scripts" / "slow_loader_rank1.py"
    code, launch = run_launch(["--cpu", "--nproc", "2", "--audit", "--run-dir", "run", str(script)], tmp_path, tag,
                              timeout=150)
    assert code == 0, launch.output
    assert "rank 1 waits for data" in launch.output and "DataLoader's num_workers" in launch.output, launch.output
    audit = json.loads((tmp_path / "run" / "audit.json").read_text())
    (finding,) = [f for f in audit["findings"] if f["kind"] == "straggler"]
    assert (finding["details"]["rank"], finding["details"]["cause"]) == (1, "data")
    shown = cli("doctor", "run", cwd=tmp_path)
    assert "rank 1 waits for data" in shown.stderr, shown.stderr
