"""The step anatomy on a CUDA device (engine/anatomy.py ``EventStepClock``): events paired per phase, read at take.

The bookkeeping runs here with a fake event whose time the test sets; the gpu-marked test times a tiny model with
real CUDA events.
"""

from __future__ import annotations

import time

import pytest
import torch

from mgpucli.engine.anatomy import EventStepClock, StepClock
from mgpucli.run_records import step_anatomy


class FakeEvent:
    """A CUDA event's interface on a clock the test moves: ``record`` notes the time, ``elapsed_time`` in ms."""

    now = 0.0
    synchronized: list[FakeEvent] = []

    def __init__(self):
        self.at: float | None = None

    def record(self) -> None:
        self.at = FakeEvent.now

    def synchronize(self) -> None:
        FakeEvent.synchronized.append(self)

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.at is not None and other.at is not None, "an event read before it was recorded"
        return (other.at - self.at) * 1000.0


@pytest.fixture
def clock():
    FakeEvent.now, FakeEvent.synchronized = 0.0, []
    return EventStepClock(event=FakeEvent)


def at(seconds: float, clock: EventStepClock):
    FakeEvent.now = seconds
    return clock.mark()


def test_the_device_picks_the_clock_once():
    assert type(StepClock.for_device(torch.device("cpu"))) is StepClock
    assert type(StepClock.for_device(torch.device("cuda", 0))) is EventStepClock  # built without touching a GPU


def test_events_pair_per_phase_accumulate_across_micro_steps_and_read_only_at_take(clock):
    clock.add_data(0.5)  # host work: a host clock, as on CPU
    started = at(1.0, clock)
    clock.add_backward(started, at(1.5, clock), communicated=False)  # a no_sync micro-step
    FakeEvent.now = 2.6
    clock._gradient_ready(None)
    FakeEvent.now = 2.75
    clock._gradient_ready(None)  # the last gradient counts: its event is recorded again
    handed = clock.handed_over
    started = at(2.0, clock)
    ended = at(3.0, clock)
    clock.add_backward(started, ended)  # 0.75 s computing, 0.25 s waiting for the all-reduce
    assert clock.handed_over is None and handed.at == 2.75
    started = at(3.0, clock)
    last = at(3.2, clock)
    clock.add_optimizer(started, last)
    assert FakeEvent.synchronized == []  # nothing waited for while stepping
    assert clock.take() == pytest.approx([0.5, 1.25, 0.25, 0.2])
    assert FakeEvent.synchronized == [last]  # one wait, for the interval's last event
    assert clock.take() == [0.0, 0.0, 0.0, 0.0] and FakeEvent.synchronized == [last]  # take reset, nothing to wait


def test_the_comm_tail_is_clamped_to_the_backward(clock):
    FakeEvent.now = 0.5
    clock._gradient_ready(None)  # noted before this backward started (a stray hook): at most all of it
    clock.add_backward(at(1.0, clock), at(2.0, clock))
    FakeEvent.now = 4.0
    clock._gradient_ready(None)  # recorded after backward's end event: no negative tail
    clock.add_backward(at(3.0, clock), at(3.5, clock))
    assert clock.take() == pytest.approx([0.0, 0.5, 1.0, 0.0])
    assert FakeEvent.synchronized[-1].at == 3.5  # no optimizer step yet: backward's end is the last event


@pytest.mark.gpu
def test_real_cuda_events_time_a_tiny_model_on_cuda0():
    device = torch.device("cuda", 0)
    clock = StepClock.for_device(device)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(device)
    clock.watch_gradients(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(512, 256, device=device)
    torch.cuda.synchronize()
    wall = time.perf_counter()
    steps = 20
    for _ in range(steps):
        started = clock.mark()
        model(inputs).square().mean().backward()
        clock.add_backward(started, clock.mark())
        started = clock.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.add_optimizer(started, clock.mark())
    seconds = clock.take()  # waits for the last event itself
    shares = step_anatomy.figures(seconds, time.perf_counter() - wall, steps)
    assert seconds[1] > 0 and seconds[3] > 0 and seconds[2] >= 0
    assert sum(shares[p] for p in step_anatomy.PHASES) == pytest.approx(1.0)
    assert clock.take() == [0.0, 0.0, 0.0, 0.0]
