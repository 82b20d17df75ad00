"""benchmarks/sweep_overhead.py's logic without processes: both sides run the same trials, and the rounds' per-trial
differences give the verdict."""

from __future__ import annotations

from benchmarks.sweep_overhead import TARGET_S, Side, commands, summarise, table


def test_both_sides_run_the_same_trials_one_at_a_time():
    by_hand, sweep = commands("A", 3, 1, "/v/bin/python"), commands("B", 3, 1, "/v/bin/python")
    assert [c[3:] for c in by_hand] == [
        ["launch", "--cpu", "--nproc", "1", "quickstart", "trainer.epochs=1", f"optim.lr={v}", f"run_dir=t{i}"]
        for i, v in enumerate(("0.1", "0.05", "0.01"))]
    (one,) = sweep
    assert one[3:] == ["sweep", "--cpu", "--nproc-per-run", "1", "--parallel", "1", "--name", "s", "quickstart",
                       "trainer.epochs=1", "optim.lr=0.1,0.05,0.01"]


def test_the_rounds_per_trial_differences_give_the_verdict():
    def rounds(diffs):
        return [{"A": Side("A", 15.0), "B": Side("B", 17.5 + 3 * d, start_s=2.5)} for d in diffs]

    fast = summarise(rounds([0.3, 0.4, 0.2, 0.5, 0.3, 0.35]), 3)
    assert fast["verdict"] == "ok" and abs(fast["per_trial_s"][0] - 0.3) < 1e-9  # the start is not per trial
    assert abs(fast["whole_per_trial_s"][0] - (2.5 / 3 + 0.3)) < 1e-9
    assert summarise(rounds([2.0] * 6), 3)["verdict"] == "MISSED"
    broken = rounds([0.3] * 6)
    broken[2]["B"] = Side("B", 4.0, "mgpu sweep: exit 1")  # no start_s: not counted
    s = summarise(broken, 3)
    assert len(s["per_trial_s"]) == 5 and s["errors"] == ["mgpu sweep: exit 1"]
    assert any(f"< {TARGET_S:g} s | ok" in line for line in table(fast, 3))
    assert "mgpu sweep: exit 1" in table(s, 3)[-1]
