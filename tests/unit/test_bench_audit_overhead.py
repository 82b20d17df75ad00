"""benchmarks/audit_overhead.py's logic without jobs: the two commands differ by --audit alone, and the rounds'
ratios, the weights and the findings give the verdicts."""

from __future__ import annotations

from pathlib import Path

from benchmarks.audit_overhead import Job, command, parse_args, summarise, table


def test_both_sides_launch_the_hand_written_loop_and_differ_by_audit_alone():
    args = parse_args(["--nproc", "2"])
    a, b = command("A", "mlp", args, Path("/o")), command("B", "mlp", args, Path("/o"))
    assert a[1:5] == ["launch", "--cpu", "--nproc", "2"] and "--audit" not in a
    assert [t for t in b if t != "--audit"] == a and b.index("--audit") < b.index("--run-dir")
    assert a[-8:] == ["--workload", "mlp", "--epochs", "10", "--device", "cpu", "--out", "/o"]
    assert a[a.index("--run-dir") + 1] == "/o/run" and a[a.index("--run-dir") + 2].endswith("handwritten.py")
    gpu = command("B", "charlm", parse_args(["--gpus", "2"]), Path("/o"))
    assert gpu[1:5] == ["launch", "--gpus", "2", "--audit"] and gpu[gpu.index("--device") + 1] == "cuda"


def _job(side: str, step_ms: float, findings: list[str] | None = None, error: str | None = None) -> Job:
    return Job(side, 0, 10.0, step_s=step_ms / 1e3, steps=600, first_step_s=4.0,
               findings=findings if side == "B" else None, error=error)


def test_rounds_give_ratios_verdicts_and_findings():
    ratios = [1.00, 1.01, 1.00, 1.005, 0.99, 1.01, 1.0, 1.002]
    rounds = [{"A": _job("A", 2.0), "B": _job("B", 2.0 * r, [])} for r in ratios]
    s = summarise(rounds, [True] * 8, 1.02)
    assert s["step_verdict"] == "ok" and s["weights_verdict"] == "ok" and s["findings_verdict"] == "ok"
    rounds[0]["B"] = _job("B", 2.0, ["set_epoch_missing"])
    rounds[1]["A"] = _job("A", 2.0, error="exit 134, 0 timed steps")
    s = summarise(rounds, [True] * 7, 1.02)
    assert s["complete"] == 7 and s["findings"] == ["set_epoch_missing"] and s["findings_verdict"] == "MISSED"
    lines = table("mlp", s, 10)
    assert any("| findings (a correct loop) | | | set_epoch_missing | none | MISSED |" in line for line in lines)
    assert any("round 2 without --audit: exit 134" in line for line in lines)
