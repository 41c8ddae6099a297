"""StallWatch on a clock the test moves: what counts as every worker stalling."""

from __future__ import annotations

import logging

import pytest

from hetrl.learner import stalls
from hetrl.learner.stalls import StallWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def poll(self, watch: StallWatch, seconds: float) -> None:
        """The learner waits `seconds`, polling every 0.5 s as the batcher does."""
        for _ in range(int(seconds / 0.5)):
            self.now += 0.5
            watch.waiting(2)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(stalls.time, "monotonic", clock)
    return clock


def test_a_slow_update_is_not_every_worker_stalling(clock: Clock, caplog) -> None:
    # The atari preset on a starved CPU: the learner holds every credit through a 12 s
    # update, then the workers need 1.2 s for their fragments. Nothing hung.
    watch = StallWatch(10.0)
    caplog.set_level(logging.WARNING, logger="hetrl.metrics")
    for _ in range(3):
        watch.fragment(1.2)
        clock.now += 12.0  # the update: no poll meanwhile
        clock.poll(watch, 1.0)
    assert watch.stalls == 0 and watch.stalled_seconds == 0.0
    assert "stalled" not in caplog.text


def test_workers_that_send_nothing_while_the_learner_waits_are_a_stall(
        clock: Clock, caplog) -> None:
    watch = StallWatch(10.0)
    caplog.set_level(logging.WARNING, logger="hetrl.metrics")
    watch.fragment(1.2)
    clock.now += 12.0  # an update first: its time is not counted
    clock.poll(watch, 9.5)  # 9 s of waiting since its first poll after the update
    assert watch.stalls == 0
    clock.poll(watch, 1.5)  # 10.5 s
    assert watch.stalls == 1 and "every worker is stalled" in caplog.text
    clock.now += 0.5
    watch.fragment(1.2)
    assert watch.stalled_seconds == pytest.approx(11.0)
    assert "arrive again after a 11 s stall" in caplog.text
