"""The fit probe for real: ``mgpu train --probe`` alone and under torchrun, gloo on CPU, and what it must not touch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_launch import run_launch
from tests.inproc import COMPOSE_CHILD, cli
from tests.procs import RECIPES, assert_usage_error, mgpu, torchrun

CHARLM = str(RECIPES / "charlm.yaml")
QUICK = str(RECIPES / "quickstart.yaml")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_processes_report_every_rank_and_write_nothing(tmp_path):
    r = torchrun(2, "train", CHARLM, "--probe", "--probe-steps", "5", "--json", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.output
    assert r.elapsed < 60, r.elapsed  # well under a minute on 2 shared cores (a bound against a hang, not a benchmark)
    report = json.loads(r.stdout)  # rank 0 alone prints, and only the JSON object
    assert (report["world_size"], report["strategy"], report["measured_steps"]) == (2, "ddp", 5)
    assert [k["rank"] for k in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert rank["peak_rss_bytes"] > 50 * 2**20 and rank["cuda"] is None
        assert rank["step_time_s"] > 0 and rank["samples_per_s"] > 0
    assert report["samples_per_s"] > 0 and report["global_batch"] == 32
    assert report["epoch_time_s"] == report["steps_per_epoch"] * report["step_time_s"] and report["fits"]
    (host,) = report["hosts"].values()
    assert host["ranks"] == 2 and host["peak_rss_sum_bytes"] == sum(k["peak_rss_bytes"] for k in report["ranks"])
    assert list(tmp_path.iterdir()) == []  # no run dir, no checkpoint, no file at all


def test_an_existing_run_is_left_exactly_as_it_was(tmp_path):
    first = cli("train", QUICK, "data.train.num_samples=512", "trainer.max_steps=4", cwd=tmp_path)
    assert first.returncode == 0, first.output
    before = snapshot(tmp_path)
    assert "runs/quickstart/checkpoints/last.pt" in before
    r = cli("train", QUICK, "data.train.num_samples=512", "--probe", "--probe-steps", "3", cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert r.stdout == ""  # people's report goes to stderr
    for text in ("fit probe: quickstart on 1 process(es), cpu", "3 warm-up + 3 timed optimizer steps", "peak RSS",
                 "samples/s", "an epoch (16 steps) ~", "Nothing was written"):
        assert text in r.stderr, r.stderr
    assert snapshot(tmp_path) == before  # refused nothing, touched nothing


def test_options_that_do_not_combine_with_the_probe(tmp_path):
    assert_usage_error(cli("train", QUICK, "--probe", "--resume", "auto", cwd=tmp_path), "--probe and --resume")
    assert_usage_error(cli("train", QUICK, "--probe", "--probe-steps", "0", cwd=tmp_path), "at least one step")
    assert_usage_error(cli("train", QUICK, "--json", cwd=tmp_path), "use it with --probe")
    for command in (["train", QUICK], ["launch", "--cpu", "--nproc", "2", QUICK], ["train", QUICK, "--check"]):
        assert_usage_error(cli(*command, "--probe-steps", "5", cwd=tmp_path, allowed=(COMPOSE_CHILD,)), "--probe-steps",
                           "use it with --probe")  # not silently ignored
    assert list(tmp_path.iterdir()) == []


def test_launch_probe_prints_every_ranks_figures_and_leaves_the_run_dir_alone(tmp_path, tag):
    small = ["+data.train.num_chars=20000", "+data.val.num_chars=8000"]
    first = cli("train", CHARLM, *small, "trainer.max_steps=2", cwd=tmp_path)
    assert first.returncode == 0, first.output
    before = snapshot(tmp_path / "runs")
    code, launch = run_launch(["--cpu", "--nproc", "2", "charlm", *small, "--probe", "--probe-steps", "5", "--json"],
                              tmp_path, tag)
    assert code == 0, launch.output
    report = json.loads(launch.out_path.read_text())  # stdout: the report alone
    assert report["world_size"] == 2 and [k["rank"] for k in report["ranks"]] == [0, 1]
    assert all(k["peak_rss_bytes"] > 0 and k["step_time_s"] > 0 and k["samples_per_s"] > 0 for k in report["ranks"])
    assert snapshot(tmp_path / "runs") == before  # its checkpoints were no reason to refuse, and stay as they were
    dry = cli("launch", "--cpu", "--nproc", "2", "charlm", "--probe", "--dry-run", cwd=tmp_path,
              allowed=(COMPOSE_CHILD,))
    assert dry.returncode == 0 and "train charlm" in dry.stdout and "--probe --probe-steps 20" in dry.stdout
    assert_usage_error(cli("launch", "--cpu", "charlm", "--probe", "--resume", "auto", cwd=tmp_path,
                           allowed=(COMPOSE_CHILD,)), "--probe and --resume")


@pytest.mark.gpu
def test_gpu_launch_probe_on_every_gpu(tmp_path):
    r = mgpu("launch", "--gpus", "all", CHARLM, "--probe", "--probe-steps", "5", "--json", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.output
    report = json.loads(r.stdout)
    assert all(k["cuda"]["max_reserved_bytes"] > 0 for k in report["ranks"]) and report["fits"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.gpu
def test_gpu_probe_reports_the_allocators_peaks(tmp_path):
    r = mgpu("train", CHARLM, "trainer.device=cuda", "--probe", "--probe-steps", "5", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.output
    (rank,) = json.loads(r.stdout)["ranks"]
    cuda = rank["cuda"]
    assert 0 < cuda["max_allocated_bytes"] <= cuda["max_reserved_bytes"] < cuda["total_bytes"]
    assert rank["device"] == "cuda:0" and rank["peak_rss_bytes"] > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
def test_gpu_probe_that_does_not_fit_names_the_phase_and_the_knobs(tmp_path):
    # a 2**25-wide hidden layer on a 4096-sample batch: 512 GiB of activations in the first forward
    r = mgpu("train", QUICK, "model.hidden=[33554432]", "data.batch_size=4096", "trainer.device=cuda", "--probe",
             "--probe-steps", "1", cwd=tmp_path, timeout=300)
    assert r.returncode == 1, r.output
    assert "rank 0: it does not fit: out of GPU memory in the forward of warm-up step 1" in r.stderr, r.stderr
    assert "1. data.batch_size=2048 trainer.grad_accum=2" in r.stderr and "trainer.strategy=fsdp" in r.stderr
    assert "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []


def test_probe_scaling_compares_one_process_with_two(tmp_path, tag):
    code, launch = run_launch(["--cpu", "--nproc", "2", "quickstart", "--probe", "--probe-steps", "5",
                               "--probe-scaling", "--json"], tmp_path, tag, timeout=180)
    assert code == 0, launch.output
    report = json.loads(launch.out_path.read_text())
    scaling = report["scaling"]
    assert scaling["processes"] == 2 and scaling["one_process"]["samples_per_s"] > 0
    one = scaling["one_process"]["samples_per_s"]
    assert scaling["efficiency"] == pytest.approx(report["samples_per_s"] / (2 * one))
    assert scaling["one_process"]["anatomy"]["comm"] == 0  # one process has no gradient all-reduce to wait for
    for rank in report["ranks"]:  # each rank's step time by phase, shares of its wall time
        assert sum(rank["anatomy"][p] for p in ("data", "compute", "comm", "optimizer", "other")) == pytest.approx(1)
    # what the launch prints for people, without --json: the same report, rendered (mgpucli/cli/probe_report.py)
    from mgpucli.cli.probe_report import lines

    err = "\n".join(lines(report))
    for text in ("scaling: the same 5 timed steps on 1 process and on 2", "processes", "efficiency", "2 (rank 1)",
                 "2 (job)"):
        assert text in err, err
    assert_usage_error(cli("launch", "--cpu", "--nproc", "2", "quickstart", "--probe-scaling", cwd=tmp_path,
                           allowed=(COMPOSE_CHILD,)), "--probe-scaling", "use it with --probe")
    assert_usage_error(cli("launch", "--cpu", "quickstart", "--probe", "--probe-scaling", cwd=tmp_path,
                           allowed=(COMPOSE_CHILD,)), "--nproc (2 or more)")
