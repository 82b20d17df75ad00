"""mgpucli.cpus: the usable core count every per-process thread split starts from (stdlib only)."""

from __future__ import annotations

from mgpucli import cpus


def test_counts_the_affinity_mask_not_the_machine(monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 64)
    assert cpus.available_cores() == 3


def test_without_an_affinity_api_falls_back_to_the_cpu_count_and_never_to_zero(monkeypatch):
    monkeypatch.delattr(cpus.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 8)
    assert cpus.available_cores() == 8
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: None)  # "undetermined"
    assert cpus.available_cores() == 1


def test_threads_per_process_shares_the_usable_cores_and_gives_each_at_least_one(monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert cpus.threads_per_process(2) == 4
    assert cpus.threads_per_process(3) == 2  # the remainder is left idle, as torchrun's split does
    assert cpus.threads_per_process(16) == 1
    assert cpus.threads_per_process(0) == 8  # "no processes" counts as one
