"""Tell a stall from slowness, and a frozen learner from frozen workers.

`StallWatch` notices when no fragment arrives from any worker for longer than a slow
fragment takes while the learner waits: every worker stalled (a hung env everywhere,
frozen hosts, a cut network). Slow is not stalled: the threshold is `threshold` seconds
or SLOW_FACTOR times the slowest recent fragment's collection, whichever is longer (a
simulator taking 13 ms a step needs 7-11 s per fragment of 8 envs x 64 steps). A named
thread ("freeze-watch") ticks four times a second; a tick more than FROZEN seconds late
means the learner process itself did not run (SIGSTOP, a suspended VM, a starved CPU):
that is said once, naming the learner, and that time is never blamed on the workers.
Nor is the time the learner spends away from its polls (an update, a save): the gap is
counted from its first poll after it, so a slow update is not a stall of every worker.
Warnings go out as things happen; stalled seconds are added up so the verdict can tell
a stall from a shortage of workers. It watches from the first fragment on: before it,
connect timeouts apply. It decides nothing about training.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

log = logging.getLogger("hetrl.metrics")

FROZEN = 2.0
"""Seconds a 0.25 s tick may be late before the learner counts as frozen."""

AWAY = 2.0
"""Seconds between two of the learner's polls (every 0.5 s while it waits) that mean it
was away meanwhile: an update or a save, not waiting for fragments."""


class StallWatch:
    """Stalls of every worker, told apart from slow fragments and a frozen learner."""

    SLOW_FACTOR = 3.0
    RECENT = 20  # fragments the slowest is taken over

    def __init__(self, threshold: float) -> None:
        self.base_threshold = threshold
        self._collect: collections.deque[float] = collections.deque(maxlen=self.RECENT)
        self._last: float | None = None
        self._warned = False
        self._stalled = 0.0  # seconds of stalls that have ended
        self.stalls = 0
        self.frozen_seconds = 0.0
        """Seconds the learner process itself did not run."""
        self._thawed = 0.0  # monotonic end of the last freeze
        self._present: float | None = None  # the learner's last poll or fragment
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="freeze-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def threshold(self) -> float:
        """Seconds without a fragment that count as a stall now."""
        slowest = max(self._collect, default=0.0)
        return max(self.base_threshold, self.SLOW_FACTOR * slowest)

    def fragment(self, collect_seconds: float = 0.0) -> None:
        """A fragment arrived; it took its worker `collect_seconds` to collect."""
        self._collect.append(collect_seconds)
        now = self._present = time.monotonic()
        if self._warned and self._last is not None:
            gap = now - self._last
            self._stalled += gap
            log.warning("fragments arrive again after a %.0f s stall", gap)
            self._warned = False
        self._last = now

    def excused(self) -> None:
        """The learner itself holds every credit back (an update or a save runs): no
        worker can send, so this time is nobody's stall."""
        self._present = time.monotonic()
        if self._last is not None and not self._warned:
            self._last = self._present

    def waiting(self, workers: int) -> None:
        """The learner is waiting for fragments (called every fraction of a second)."""
        now, before = time.monotonic(), self._present
        self._present = now
        if self._last is None:
            return
        if before is not None and now - before > AWAY and not self._warned:
            # The learner was training or saving, with every credit in hand or nobody
            # listening: a fragment that took long to come then is not the workers' stall.
            self._last = now
        gap = now - max(self._last, self._thawed)  # a frozen learner is not the workers'
        if gap > self.threshold and not self._warned:
            self._warned = True
            self.stalls += 1
            log.warning("no fragment from any of the %d workers for %.0f s (their slowest "
                        "recent fragment took %.1f s): every worker is stalled (an env hung "
                        "everywhere, frozen env hosts, or the network), which more workers "
                        "would not fix; training resumes when they do",
                        workers, gap, max(self._collect, default=0.0))

    @property
    def stalled_seconds(self) -> float:
        """Seconds spent in stalls, the one going on included."""
        ongoing = (time.monotonic() - self._last
                   if self._warned and self._last is not None else 0.0)
        return self._stalled + ongoing

    def _tick(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.25):
            now = time.monotonic()
            late = now - last - 0.25
            last = now
            if late > FROZEN:
                self.frozen_seconds += late
                self._thawed = now
                log.warning("the learner process did not run for %.0f s (stopped, suspended "
                            "or starved of CPU); the workers are not to blame for that time",
                            late)
