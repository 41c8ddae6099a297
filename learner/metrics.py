"""Where training metrics go: TensorBoard events, a JSONL file, and a live progress line.

Metric names follow CleanRL (`charts/episodic_return`, `charts/SPS`, `losses/...`) so
curves compare with published ones. Every record in metrics.jsonl carries
`global_step` and `wall_seconds`. Nothing here decides anything about training.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path


class MetricsWriter:
    """Append-only metrics sink for one run directory."""

    def __init__(self, out_dir: Path, progress: bool = True, progress_every: float = 2.0) -> None:
        from torch.utils.tensorboard import SummaryWriter  # heavy import, learner only

        out_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = (out_dir / "metrics.jsonl").open("a", buffering=1)
        self._tb = SummaryWriter(str(out_dir / "tb"))
        self._start = time.monotonic()
        self._progress = progress and sys.stderr is not None
        self._progress_every = progress_every
        self._last_progress = 0.0
        self._tty = bool(getattr(sys.stderr, "isatty", lambda: False)())

    @property
    def wall_seconds(self) -> float:
        return time.monotonic() - self._start

    def log(self, step: int, values: dict[str, float]) -> None:
        record = {"global_step": step, "wall_seconds": round(self.wall_seconds, 3)}
        for key, value in values.items():
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            record[key] = value
            self._tb.add_scalar(key, value, step)
        self._jsonl.write(json.dumps(record) + "\n")

    def progress(self, line: str) -> None:
        """Rewrite the progress line on a terminal, print it every few seconds otherwise."""
        if not self._progress:
            return
        now = time.monotonic()
        if now - self._last_progress < self._progress_every:
            return
        self._last_progress = now
        end = "\r" if self._tty else "\n"
        sys.stderr.write(line.ljust(100 if self._tty else 0) + end)
        sys.stderr.flush()

    def close(self) -> None:
        if self._progress and self._tty and self._last_progress:
            sys.stderr.write("\n")  # leave the rewritten progress line behind
        self._tb.close()
        self._jsonl.close()
