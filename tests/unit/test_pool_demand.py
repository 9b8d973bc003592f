"""The pre-created pool's size from demand (``orchestrator/pool_demand.py``): requests that
come within a second of each other add up, the largest of the window counts, bounded by the
floor and the ceiling, and forgotten once the window has passed."""

from __future__ import annotations

from aenv.orchestrator.pool_demand import BURST_S, Demand


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_nothing_asked_keeps_the_floor() -> None:
    demand = Demand(floor=16, ceiling=64, window_s=600, clock=Clock())
    assert demand.target() == 16
    assert demand.changes_in() is None


def test_a_fork_of_many_is_one_demand_bounded_by_the_ceiling() -> None:
    clock = Clock()
    demand = Demand(floor=16, ceiling=64, window_s=600, clock=clock)
    for _ in range(40):  # a fork of 40: its children ask within milliseconds
        clock.now += 0.001
        demand.record()
    assert demand.target() == 40
    for _ in range(60):
        demand.record()
    assert demand.target() == 64


def test_requests_further_apart_than_a_burst_do_not_add_up() -> None:
    clock = Clock()
    demand = Demand(floor=2, ceiling=64, window_s=600, clock=clock)
    for _ in range(10):  # creates one after the other, each 1.5 s apart
        demand.record()
        clock.now += BURST_S * 1.5
    assert demand.target() == 2
    for _ in range(5):  # then five at once, and three more a moment later
        demand.record()
    clock.now += BURST_S / 2
    demand.record(3)
    assert demand.target() == 8


def test_a_demand_is_forgotten_after_the_window() -> None:
    clock = Clock()
    demand = Demand(floor=4, ceiling=64, window_s=600, clock=clock)
    demand.record(32)
    clock.now += 100
    demand.record(10)
    assert demand.target() == 32
    assert demand.changes_in() == 500
    clock.now += 500
    assert demand.target() == 10
    clock.now += 100
    assert demand.target() == 4
    assert demand.changes_in() is None


def test_a_ceiling_below_the_floor_is_the_floor() -> None:
    demand = Demand(floor=16, ceiling=8, window_s=600, clock=Clock())
    demand.record(100)
    assert demand.target() == 16
