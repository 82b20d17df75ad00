"""benchmarks/refusal.py's logic without processes: the two commands differ by the launcher alone, a run is a
refusal only as a user must see it, and the rounds' differences give the verdict."""

from __future__ import annotations

from benchmarks.refusal import TARGET_S, TYPOS, Refusal, command, refused, summarise, table


def test_both_commands_refuse_the_same_recipe_with_the_same_typo():
    train, launch = command("A", "optim.lrr=0.1", "/v/bin/python"), command("B", "optim.lrr=0.1", "/v/bin/python")
    assert train[-3:] == ["train", "quickstart", "optim.lrr=0.1"]
    assert launch[-6:] == ["launch", "--cpu", "--nproc", "2", "quickstart", "optim.lrr=0.1"]
    assert train[:-3] == launch[:-6] == ["/v/bin/python", "-m", "mgpucli"]  # no mgpu script beside /v/bin/python


def test_a_run_is_a_refusal_only_with_exit_2_the_did_you_mean_and_nothing_left():
    said = TYPOS["target"][1]
    assert refused("A", 1.0, 2, f"error: 1 problem(s)\n  - {said}\n", said, []).error is None
    assert "exit 0" in refused("B", 1.0, 0, "", said, []).error
    assert "timed out" in refused("B", 120.0, None, "", said, []).error
    assert "not the refusal" in refused("B", 1.0, 2, f"Traceback ...\n{said}", said, []).error
    assert "left runs" in refused("B", 1.0, 2, said, said, ["runs"]).error


def test_the_rounds_differences_give_the_verdict():
    def rounds(diffs):
        return [{"A": Refusal("A", 1.2), "B": Refusal("B", 1.2 + d)} for d in diffs]

    fast = summarise(rounds([0.1, 0.05, 0.15, 0.0, 0.1, 0.2, 0.1, 0.05]))
    assert fast["verdict"] == "ok" and len(fast["diff_s"]) == 8
    slow = summarise(rounds([3.5] * 8))
    assert slow["verdict"] == "MISSED"
    broken = rounds([0.1] * 8)
    broken[3]["B"] = Refusal("B", 0.5, "mgpu launch: exit 1")
    s = summarise(broken)
    assert len(s["diff_s"]) == 7 and s["errors"] == ["mgpu launch: exit 1"]
    assert any(f"<= +{TARGET_S} s | ok" in line for line in table("target", s))
