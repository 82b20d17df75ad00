"""Every failure signature on log excerpts as PyTorch, NCCL, gloo, CUDA and mgpu print them (pure, no processes).

The fixtures in ``fixtures/postmortem`` are written by hand from the messages' documented formats (the format
strings in torch's libraries, pytorch's and NCCL's issue trackers); several interleave ranks the way
torch's launcher prefixes them (``[rankN]:``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpucli.postmortem.lines import LogLine, parse, read_log
from mgpucli.postmortem.matchers import (
    MATCHERS,
    address_in_use,
    collective_timeout,
    cuda_oom,
    dataloader_worker,
    ddp_ready_twice,
    ddp_unused_parameters,
    explain,
    killed_by_signal,
    mgpu_error,
    nan_loss,
    peer_lost,
    python_exception,
    ranks_disagree,
)
from mgpucli.postmortem.tracebacks import parse_tracebacks

FIXTURES = Path(__file__).parent / "fixtures" / "postmortem"


def lines(name: str, rank: int | None = None) -> list[LogLine]:
    path = FIXTURES / name
    return parse(path.read_text(), rank=rank, source=str(path))


def cited(match) -> list[str]:
    return [f"{e.rank}:{e.line}" for e in match.evidence]


# ------------------------------------------------------------------------------------------------ lines
def test_rank_prefixes_are_stripped_and_give_each_line_its_rank():
    got = parse("[rank3]:[rank3]: boom\n[default1]:x\nplain\n", rank=7, source="f.log")
    assert [(g.rank, g.text, g.line) for g in got] == [(3, " boom", 1), (1, "x", 2), (7, "plain", 3)]
    assert got[0].cite() == "rank 3 f.log:1"


def test_read_log_keeps_true_line_numbers_when_only_the_tail_is_read(tmp_path: Path):
    from mgpucli.postmortem import lines as lines_mod

    path = tmp_path / "stderr.log"
    path.write_text("".join(f"line {i}\n" for i in range(1, 200_001)))  # ~2.2 MB: more than the tail read
    assert path.stat().st_size > lines_mod.TAIL_BYTES
    got = read_log(str(path), rank=0, max_lines=3)
    assert [(g.line, g.text) for g in got] == [(199_998, "line 199998"), (199_999, "line 199999"),
                                               (200_000, "line 200000")]
    assert read_log(str(tmp_path / "missing.log"), rank=0) == []


def test_line_numbers_are_left_out_rather_than_guessed_past_the_count_limit(tmp_path: Path, monkeypatch):
    from mgpucli.postmortem import lines as lines_mod

    path = tmp_path / "huge.log"
    path.write_text("".join(f"line {i}\n" for i in range(1, 200_001)))
    monkeypatch.setattr(lines_mod, "COUNT_LIMIT", 1000)
    got = read_log(str(path), rank=0, max_lines=2)
    assert [(g.line, g.text) for g in got] == [(None, "line 199999"), (None, "line 200000")]
    assert got[0].cite() == "rank 0 huge.log"


def test_tracebacks_are_parsed_behind_a_prefix_with_a_space():
    tb = parse_tracebacks(lines("gloo_timeout.log", rank=0))[-1]
    assert tb.exc_type == "RuntimeError" and "Timed out waiting 5000ms" in tb.message
    assert [f.func for f in tb.frames] == ["train_epoch", "_forward_backward", "backward", "_engine_run_backward"]
    assert tb.user_frame().func == "_forward_backward"  # torch's own frames are not "where it failed"


# ------------------------------------------------------------------------------------ collective timeout
def test_nccl_watchdog_timeout_names_the_collective_and_the_waiting_ranks():
    found = collective_timeout(lines("nccl_timeout_interleaved.log"))
    assert found.signature == "collective_timeout" and not found.cause
    assert found.rank == 0 and cited(found)[0] == "0:1"
    assert found.details["op"] == "ALLREDUCE" and found.details["seq"] == 1580
    assert found.details["timeout_s"] == 600 and found.details["numel"] == 466119168
    assert found.details["waiting_ranks"] == [0, 2, 3]  # rank 1 never timed out: it is the late one
    assert "mismatch" not in found.details


def test_nccl_timeouts_in_different_collectives_are_called_a_mismatch():
    found = collective_timeout(lines("nccl_timeout_mismatch.log"))
    assert found.rank == 7 and found.details["mismatch"] == ["ALLREDUCE#80078", "BROADCAST#80078"]
    assert "different order" in found.fix


def test_gloo_timeout_finds_the_collective_from_the_traceback():
    found = collective_timeout(lines("gloo_timeout.log", rank=0))
    assert found.details["timeout_s"] == 5 and "gradient all-reduce in backward" in found.details["collective"]
    assert cited(found) == ["0:15"]


def test_gloo_timeout_in_the_log_interval_all_reduce_is_named():
    """The interval's all-reduce starts at one step and is waited for at the next (LogInterval.read_reduction,
    also reached through a save's flush): the frames name it."""
    base = lines("gloo_timeout.log", rank=0)
    text = [line.text for line in base]
    cut = next(i for i, t in enumerate(text) if "Traceback" in t)
    frames = ["  File \"/work/main/mgpucli/engine/log_interval.py\", line 93, in flush",
              "    self.read_reduction()",
              "  File \"/work/main/mgpucli/engine/log_interval.py\", line 101, in read_reduction",
              "    done.work.wait()",
              "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
              "Timed out waiting 5000ms for recv operation to complete"]
    log = "\n".join(text[: cut + 1] + frames) + "\n"
    found = collective_timeout(parse(log, rank=0, source="gloo_interval.log"))
    assert found.details["collective"] == "the log-interval all-reduce of metrics and flags"


def test_monitored_barrier_names_the_late_ranks():
    found = collective_timeout(lines("monitored_barrier.log", rank=0))
    assert found.details["late_ranks"] == [1, 3] and found.details["collective"] == "monitored_barrier"


def test_mgpus_own_timeout_message_gives_phase_step_and_late_ranks():
    found = explain(lines("mgpu_timeout.log", rank=0))
    assert found.signature == "collective_timeout"
    assert found.details["collective"] == "backward (DDP gradient all-reduce)"
    assert found.details["late_ranks"] == [1] and found.step == 3 and found.details["timeout_s"] == 5


# ---------------------------------------------------------------------------------------------- memory
def test_cuda_oom_new_format_on_interleaved_ranks():
    found = explain(lines("cuda_oom.log"))
    assert found.signature == "cuda_oom" and found.rank == 2  # not rank 0, which only lost its peer
    assert found.details["gpu"] == 2 and found.details["size"] == "2.00 GiB"
    assert found.details["free"] == "1.23 GiB" and found.details["mine"] == "71.40 GiB"
    assert "expandable_segments" in found.fix  # 18.71 GiB reserved but unallocated
    assert "other processes" in found.fix  # 79.15 - 1.23 - 71.40 = 6.5 GiB used by someone else
    assert cited(found) == ["2:6"]


def test_cuda_oom_old_format():
    found = cuda_oom(lines("cuda_oom_old.log", rank=0))
    assert found.details["gpu"] == 0 and found.details["total"] == "7.79 GiB" and found.details["free"] == "12.88 MiB"
    assert "data.batch_size" in found.fix and "expandable_segments" not in found.fix


def test_dataloader_bus_error_points_at_shared_memory():
    found = dataloader_worker(lines("dataloader_bus_error.log", rank=1))
    assert found.details["kind"] == "shm" and found.details["signal"] == "Bus error" and found.details["pids"] == "4123"
    assert "--shm-size" in found.fix and found.rank == 1


def test_dataloader_worker_killed_points_at_host_memory():
    found = explain(lines("dataloader_killed.log", rank=0))
    assert found.signature == "dataloader_worker" and found.details["kind"] == "killed"
    assert "out-of-memory killer" in found.fix


def test_sigkill_from_torchs_agent_output_says_oom_killer():
    found = killed_by_signal(lines("agent_sigkill.log", rank=1))
    assert found.details["signal"] == "SIGKILL" and found.cause
    assert "out-of-memory killer" in found.title and "dmesg" in found.fix


def test_segfault_is_a_native_crash():
    found = killed_by_signal(lines("segfault.log", rank=0))
    assert found.details["signal"] == "SIGSEGV" and "native code" in found.fix


def test_teardown_sigterm_is_not_a_cause():
    found = killed_by_signal([LogLine(1, "exit code -15 (SIGTERM), as recorded by the launcher", "launch.json")])
    assert found.details["signal"] == "SIGTERM" and not found.cause


# --------------------------------------------------------------------------------------------- network
def test_address_in_use_libuv_store():
    found = address_in_use(lines("address_in_use.log"))
    assert found.rank == 0 and found.details["port"] == 29500 and cited(found) == ["0:5"]


def test_address_in_use_old_socket_backend():
    found = explain(lines("address_in_use_old.log", rank=0))
    assert found.signature == "address_in_use" and found.details["port"] == 29500


def test_peer_lost_is_an_echo():
    found = peer_lost(lines("cuda_oom.log", rank=0))
    assert found.signature == "peer_lost" and not found.cause


# ------------------------------------------------------------------------------------------------- DDP
def test_ddp_unused_parameters_indices_and_fix():
    found = explain(lines("ddp_unused.log"))
    assert found.signature == "ddp_unused_parameters" and found.rank == 1
    assert found.details["parameter_indices"] == [4, 5]
    for hint in ("trainer.ddp.find_unused_parameters=true", "trainer.ddp.static_graph=true",
                 "TORCH_DISTRIBUTED_DEBUG=DETAIL"):
        assert hint in found.fix


def test_ddp_unused_parameters_names_with_debug_detail():
    found = ddp_unused_parameters(lines("ddp_unused_detail.log", rank=0))
    assert found.details["parameters"] == ["aux_head.bias", "aux_head.weight"]
    assert "aux_head.bias" in found.title and "TORCH_DISTRIBUTED_DEBUG" not in found.fix  # already named


def test_ddp_marked_ready_twice():
    found = ddp_ready_twice(lines("ddp_ready_twice.log"))
    assert found.rank == 0 and found.details["parameter"] == "blocks.0.mlp.weight"
    assert "use_reentrant=False" in found.fix and "static_graph" in found.fix
    assert explain(lines("ddp_ready_twice.log")).signature == "ddp_ready_twice"


def test_ranks_disagree_on_the_model():
    found = ranks_disagree(lines("ranks_disagree.log"))
    assert found.rank == 1 and "same recipe" in found.fix


def test_ranks_disagree_on_collectives():
    assert explain(lines("collective_mismatch.log")).signature == "ranks_disagree"


def test_not_every_rank_joined():
    found = ranks_disagree(lines("clients_joined.log", rank=0))
    assert found.details == {"ranks": [0], "joined": 2, "world_size": 4}
    assert "--nnodes" in found.fix


# ------------------------------------------------------------------------------------------------ code
def test_nan_from_mgpu_with_its_own_hint():
    found = nan_loss(lines("nan_mgpu.log", rank=1))
    assert found.step == 23 and found.rank == 1 and cited(found) == ["1:2", "1:3"]
    assert "--resume auto" in found.fix


def test_nan_from_user_code():
    found = explain(lines("nan_user.log", rank=0))
    assert found.signature == "nan_loss" and found.step == 1234


def test_user_exception_interleaved_with_a_peers_echo():
    mixed = lines("user_exception_interleaved.log")
    found = python_exception(mixed)
    assert found.rank == 1 and found.details["exception"] == "KeyError" and found.details["function"] == "__getitem__"
    assert cited(found) == ["1:4", "1:6", "1:9"]  # where, the source line, the exception: all rank 1's
    assert "not a distributed problem" in found.title
    rank0 = [line for line in mixed if line.rank == 0]
    assert python_exception(rank0) is None  # rank 0's traceback ends in a lost connection
    assert explain(rank0).signature == "peer_lost"


def test_mgpu_error_keeps_mgpus_hint():
    found = mgpu_error(parse("error: [rank 0] run dir runs/x already holds checkpoints (last.pt).\n"
                             "Continue it with --resume auto.\n", rank=0))
    assert found.signature == "mgpu_error" and found.fix == "Continue it with --resume auto."


def test_priorities_a_specific_signature_beats_the_exception_that_carries_it():
    assert explain(lines("cuda_oom_old.log", rank=0)).signature == "cuda_oom"  # not python_exception
    assert explain(lines("gloo_timeout.log", rank=0)).signature == "collective_timeout"
    assert explain(lines("dataloader_bus_error.log", rank=0)).signature == "dataloader_worker"


@pytest.mark.parametrize("matcher", MATCHERS, ids=lambda m: m.__name__)
def test_no_matcher_fires_on_a_healthy_log(matcher):
    healthy = parse("mgpu train quickstart: 2 process(es) on cpu\nstep 20 epoch 0  loss 1.38  accuracy 0.27\n"
                    "val step 64  loss 0.51  accuracy 0.91  (1001 samples)\n", rank=0)
    assert matcher(healthy) is None
