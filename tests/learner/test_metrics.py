"""The learner's books (learner.metrics.RunBooks): the summary counts every stream counter
once, and a resumed run's books continue the totals its checkpoint carried."""

from __future__ import annotations

import collections
import json
from pathlib import Path

from hetrl.learner.connections import COUNTERS, StreamFailure
from hetrl.learner.metrics import RunBooks
from hetrl.learner.settings import LearnerSettings
from hetrl.learner.stalls import StallWatch


class FakeStream:
    def __init__(self, address: str, **counts: int) -> None:
        self.address, self.in_flight, self.hello = address, 1, None
        for name in COUNTERS:
            setattr(self, name, counts.get(name, 0))


class FakeBatcher:
    """The counts a Batcher keeps as fragments arrive."""

    def __init__(self) -> None:
        self.global_step, self.episodes, self.dropped_lag = 0, 0, 0
        self.lag_histogram: collections.Counter[int] = collections.Counter()
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=100)

    def progress(self) -> tuple[int, tuple[float, ...]]:
        return self.global_step, tuple(self.recent_returns)


class NoSampler:
    def sample(self) -> dict[str, float]:
        return {}


def books(out: Path, streams: list[FakeStream]) -> RunBooks:
    settings = LearnerSettings(worker_addresses=tuple(s.address for s in streams),
                               progress=False)
    return RunBooks(settings, out, streams, FakeBatcher(),
                    StallWatch(10.0), NoSampler())


def summary_of(run: RunBooks, version: int = 3) -> dict:
    run.write_summary("finished", version, not_stopped=[])
    return json.loads((run.out / "summary.json").read_text())


def test_each_counter_is_in_the_summary_once_and_resumes_add_up(tmp_path: Path) -> None:
    first = books(tmp_path, [FakeStream("10.0.0.1:7000", fragments_malformed=2, sequence_gaps=1),
                             FakeStream("10.0.0.2:7000", fragments_malformed=1)])
    first.open()
    first.batcher.global_step, first.batcher.episodes = 500, 4
    first.batcher.recent_returns.extend([1.0, 3.0])
    first.waited(2.0)
    first.rejected()
    first.worker_lost(StreamFailure("10.0.0.2:7000", ConnectionError("gone")))
    summary = summary_of(first)
    assert summary["fragments_malformed"] == 3 and summary["sequence_gaps"] == 1
    assert summary["mean_return_100"] == 2.0 and summary["updates_nonfinite"] == 1
    assert summary["fragments_lost_in_flight"] == 1 and summary["runs"] == 1
    assert summary["verdict"] in ("experience-bound", "learner-bound", "balanced", "stalled")
    totals = first.totals()
    first.close()

    # The resumed process has fresh streams; the summary is of the whole run.
    second = books(tmp_path, [FakeStream("10.0.0.1:7000", fragments_malformed=5)])
    second.batcher.global_step = 500
    second.restore("ckpt-000000000500.pt", totals)
    second.open()
    summary = summary_of(second)
    assert summary["fragments_malformed"] == 8 and summary["sequence_gaps"] == 1
    assert summary["runs"] == 2 and summary["episodes"] == 4
    assert summary["learner_wait_seconds"] == 2.0 and summary["updates_nonfinite"] == 1
    assert summary["resumed_from"] == "ckpt-000000000500.pt"
    assert second.start_step == 500  # steps per second count this process's steps only
    second.close()
