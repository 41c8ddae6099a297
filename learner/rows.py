"""Rows of a run's metrics at a time-based rate, each summing up the updates since the
last one, so that a day-long job's logs stay small whatever its update rate.

A row goes out when `every` seconds have passed since the last (0: after every update)
and at the end. Per-update figures (losses, clip fraction, learning rate) are averaged
over the updates it covers, policy lag over their fragments (its max kept), and the
returns and lengths of every episode that ended in them are averaged, so no episode is
left out of the curve. Pure bookkeeping: no I/O, no clock of its own but the caller's.
"""

from __future__ import annotations

import collections
import math

import numpy as np


class Rows:
    """The updates since the last row, and when the next row is due."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._last: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._sums: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._counts: collections.Counter[str] = collections.Counter()
        self._lags: list[int] = []
        self._fragments = 0
        self._returns: list[float] = []
        self._lengths: list[float] = []
        self.updates = 0

    def add(self, stats: dict[str, float], lags: list[int], returns: np.ndarray,
            lengths: np.ndarray) -> None:
        """One update: its per-update `stats`, its fragments' policy lags, and the
        episodes that ended in its batch."""
        for key, value in stats.items():
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            self._sums[key] += float(value)
            self._counts[key] += 1
        self._lags += lags
        self._fragments += len(lags)
        self._returns += [float(r) for r in returns]
        self._lengths += [float(n) for n in lengths]
        self.updates += 1

    def due(self, now: float) -> bool:
        """Whether a row should go out now (the first update always starts one)."""
        if not self.updates:
            return False
        return self.every <= 0 or self._last is None or now - self._last >= self.every

    def take(self, now: float) -> dict[str, float]:
        """The row of the updates since the last one; starts the next."""
        row = {key: total / self._counts[key] for key, total in self._sums.items()}
        if self._lags:
            row["charts/policy_lag"] = float(np.mean(self._lags))
            row["charts/policy_lag_max"] = float(np.max(self._lags))
            row["charts/fragments_per_batch"] = self._fragments / self.updates
        if self._returns:
            row["charts/episodic_return"] = float(np.mean(self._returns))
            row["charts/episodic_length"] = float(np.mean(self._lengths))
            row["charts/episodes_in_row"] = float(len(self._returns))
        row["charts/updates_in_row"] = float(self.updates)
        self._reset()
        self._last = now
        return row
