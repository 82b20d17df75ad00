"""mgpu sweep's logic: the grid, trial names, slots, the continue rules, the summary's order, each trial's command."""

from __future__ import annotations

import pytest

from mgpucli.errors import UsageError
from mgpucli.sweep import record as records
from mgpucli.sweep.grid import expand
from mgpucli.sweep.slots import DeviceOptions, Slot, plan
from mgpucli.sweep.summary import ranked
from mgpucli.sweep.trials import TrialCommand

# ---------------------------------------------------------------------------------------------------------- the grid


def test_every_combination_is_a_trial_first_key_slowest_and_the_rest_go_to_every_trial():
    grid = expand(["optim.lr=0.1,0.01", "trainer.epochs=range(1,4)", "data.batch_size=32"])
    assert grid.common == ("data.batch_size=32",)
    assert [t.overrides for t in grid.trials][:4] == [
        ["optim.lr=0.1", "trainer.epochs=1"], ["optim.lr=0.1", "trainer.epochs=2"],
        ["optim.lr=0.1", "trainer.epochs=3"], ["optim.lr=0.01", "trainer.epochs=1"]]
    assert len(grid.trials) == 6 and [t.index for t in grid.trials] == list(range(6))


def test_a_trial_is_named_by_its_index_and_its_values_as_a_directory_keeps_them():
    grid = expand(["model.hidden=choice([64],[128,128])", "+model.dropout=0.0,0.5"])
    assert [t.name for t in grid.trials] == ["0-hidden=64-dropout=0.0", "1-hidden=64-dropout=0.5",
                                              "2-hidden=128_128-dropout=0.0", "3-hidden=128_128-dropout=0.5"]
    assert grid.trials[3].overrides == ["model.hidden=[128,128]", "+model.dropout=0.5"]


def test_two_keys_ending_alike_keep_their_whole_names_and_indices_are_padded():
    grid = expand([f"optim.lr={','.join(str(i) for i in range(1, 12))}", "scheduler.lr=1,2"])
    assert grid.trials[0].name == "00-optim.lr=1-scheduler.lr=1" and grid.trials[21].name.startswith("21-")


@pytest.mark.parametrize("overrides, fragments", [
    (["optim.lr=0.1"], ["Nothing to sweep", "optim.lr=0.1,0.01,0.001"]),
    (["optim.lr=0.1,0.01", "run_dir=here"], ["run_dir=here", "its own run dir", "--name NAME"]),
    (["optim.lr=interval(0,1)"], ["an interval has no grid", "optim.lr=0.1,0.01,0.001"]),
    (["optim.lr=0.1,,"], ["optim.lr=0.1,,: not an override Hydra can read"]),
])
def test_a_sweep_hydra_cannot_expand_is_refused_with_the_fix(overrides, fragments):
    with pytest.raises(UsageError) as err:
        expand(overrides)
    assert all(f in str(err.value) for f in fragments), str(err.value)


# ---------------------------------------------------------------------------------------------------------- slots


def test_eight_gpus_two_per_run_are_four_slots_that_share_no_gpu():
    slots = plan(DeviceOptions(gpus_per_run=2), visible_gpus=8, cores=64)
    assert [s.gpus for s in slots.slots] == [(0, 1), (2, 3), (4, 5), (6, 7)] and slots.note is None
    assert slots.slots[1].launch_args() == ["--gpus", "2,3"]


def test_a_gpu_list_is_used_as_given_and_one_gpu_is_a_one_element_list():
    slots = plan(DeviceOptions(gpus="0,2,4,6"), visible_gpus=8, cores=64)
    assert [s.gpus for s in slots.slots] == [(0,), (2,), (4,), (6,)]
    assert slots.slots[2].launch_args() == ["--gpus", "4,"]  # --gpus 4 would be a count


def test_a_count_that_does_not_divide_says_which_gpus_stay_idle():
    slots = plan(DeviceOptions(gpus_per_run=3), visible_gpus=4, cores=64)
    assert [s.gpus for s in slots.slots] == [(0, 1, 2)]
    assert "GPU 3 stay(s) idle" in slots.note and "3 or 6 GPUs" in slots.note


@pytest.mark.parametrize("opts, visible, fragments", [
    (DeviceOptions(gpus_per_run=5), 4, ["--gpus-per-run 5 asks for more GPUs than the sweep has (4: 0,1,2,3)"]),
    (DeviceOptions(gpus_per_run=0), 4, ["--gpus-per-run 0", "at least one GPU"]),
    (DeviceOptions(parallel=2), 4, ["--parallel is for CPU trials and needs --cpu"]),
    (DeviceOptions(cpu=True, gpus="2"), 4, ["--gpus asks for GPUs, but --cpu"]),
    (DeviceOptions(cpu=True, nproc_per_run=0), 0, ["--nproc-per-run 0: it must be at least 1"]),
    (DeviceOptions(), 0, ["No CUDA GPU is visible", "--cpu"]),
])
def test_slots_the_devices_cannot_give_are_refused(opts, visible, fragments):
    with pytest.raises(UsageError) as err:
        plan(opts, visible_gpus=visible, cores=8)
    assert all(f in str(err.value) for f in fragments), str(err.value)


def test_cpu_trials_share_the_cores_out_between_their_processes():
    slots = plan(DeviceOptions(cpu=True, nproc_per_run=2, parallel=3), visible_gpus=0, cores=12)
    assert len(slots.slots) == 3 and slots.cpu_threads == 2 and slots.note is None
    assert slots.slots[0].launch_args() == ["--cpu", "--nproc", "2"]
    crowded = plan(DeviceOptions(cpu=True, parallel=4), visible_gpus=0, cores=2)
    assert crowded.cpu_threads == 1 and "4 processes on 2 usable core(s)" in crowded.note


# ------------------------------------------------------------------------------------------------ record and resume


def _record(tmp_path, overrides=("optim.lr=0.1,0.01,0.001",)):
    return records.new("s", "quickstart", expand(list(overrides)), str(tmp_path / "runs/s"), "accuracy", "max")


def test_the_same_command_again_runs_every_trial_not_finished(tmp_path):
    rec = _record(tmp_path)
    rec.trials[0].end(0, 1.0)
    rec.trials[1].end(75, 1.0)
    assert [t.state for t in rec.trials] == ["finished", "stopped", "queued"]
    (tmp_path / "runs/s").mkdir(parents=True)
    rec.save(str(tmp_path / "runs/s"))
    again = records.load(str(tmp_path / "runs/s"))
    assert [t.name for t in records.to_run(again)] == ["1-lr=0.01", "2-lr=0.001"]
    again.trials[2].end(1, 2.0)
    assert again.trials[2].state == "failed" and records.to_run(again)[-1].name == "2-lr=0.001"  # a failed one again


def test_a_trial_ended_by_the_signal_the_sweep_passed_on_is_stopped_not_failed(tmp_path):
    rec = _record(tmp_path)
    rec.trials[0].end(130, 1.0, signalled=True)  # its launcher stopped before any worker started
    rec.trials[1].end(130, 1.0)  # a Ctrl-C that was not the sweep's
    rec.trials[2].end(1, 1.0, signalled=True)  # a failure while the sweep stopped is a failure
    assert [t.state for t in rec.trials] == ["stopped", "failed", "failed"]


def test_other_values_in_a_sweep_folder_are_refused_naming_both(tmp_path):
    rec = _record(tmp_path)
    with pytest.raises(UsageError) as err:
        records.check_same(rec, "quickstart", [], records.grid_axes(expand(["optim.lr=0.1,0.5"])), "runs/s")
    assert "runs/s holds another sweep (axes: optim.lr=0.1,0.01,0.001 then, optim.lr=0.1,0.5 now)" in str(err.value)
    assert "another --name" in str(err.value)
    same = records.grid_axes(expand(["optim.lr=0.1,0.01,0.001"]))
    records.check_same(rec, "quickstart", [], same, "runs/s")  # the same: no problem


def test_an_unreadable_record_is_refused_not_overwritten(tmp_path):
    (tmp_path / "sweep.json").write_text("{not json")
    with pytest.raises(UsageError, match="cannot be read"):
        records.load(str(tmp_path))
    assert (tmp_path / "sweep.json").read_text() == "{not json"


# ---------------------------------------------------------------------------------------------------------- summary


@pytest.mark.parametrize("mode, order", [("max", ["2-lr=0.001", "0-lr=0.1", "1-lr=0.01"]),
                                         ("min", ["0-lr=0.1", "2-lr=0.001", "1-lr=0.01"])])
def test_the_summary_puts_the_best_first_and_trials_without_the_metric_last(tmp_path, mode, order):
    rec = _record(tmp_path)
    rec.mode = mode
    rec.trials[0].best, rec.trials[1].best, rec.trials[2].best = 0.5, None, 0.9
    result = ranked(rec)
    assert [t.name for t in result.trials] == order and result.best.name == order[0]


def test_a_nan_best_is_no_best(tmp_path):
    rec = _record(tmp_path)
    rec.trials[0].best = float("nan")
    assert ranked(rec).best is None


# ---------------------------------------------------------------------------------------------------- the commands


def test_a_trial_launch_names_its_devices_values_threads_and_quoted_run_dir(tmp_path):
    rec = _record(tmp_path)
    command = TrialCommand("quickstart", ("trainer.epochs=1",), cpu_threads=2)
    trial = rec.trials[1]
    args = command.launch_args(trial, Slot(1, (), 2), resume=True)
    assert args == ["launch", "--cpu", "--nproc", "2", "--resume", "auto", "quickstart", "trainer.epochs=1",
                    "optim.lr=0.01", "trainer.cpu_threads=2", f"run_dir='{tmp_path}/runs/s/1-lr=0.01'"]
    own = TrialCommand("quickstart", ("trainer.cpu_threads=4",), cpu_threads=2).launch_args(trial, Slot(0, (3,)), False)
    assert own.count("trainer.cpu_threads=4") == 1 and not any(a == "trainer.cpu_threads=2" for a in own)
    assert own[:3] == ["launch", "--gpus", "3,"]


def test_the_best_trial_rerun_alone_is_a_command_a_shell_reads_back(tmp_path):
    import shlex

    rec = _record(tmp_path)
    line = TrialCommand("quickstart", ("trainer.epochs=1",), cpu_threads=1).rerun(rec.trials[0], Slot(0, (), 1))
    assert line == f"mgpu launch --cpu --nproc 1 quickstart trainer.epochs=1 optim.lr=0.1 " \
                   f"\"run_dir='{tmp_path}/runs/s/0-lr=0.1-alone'\""  # all the cores its own: no thread count
    assert shlex.split(line)[-1] == f"run_dir='{tmp_path}/runs/s/0-lr=0.1-alone'"
