"""Disk space kept for the model and a checkpoint, so a full disk never costs the run.

At the start of a run the learner allocates a file (`.hetrl-reserve`, real blocks via
posix_fallocate, not a sparse file) as big as a model and a checkpoint together, with
room to spare. Metrics, TensorBoard and anything else on the disk can fill the rest;
when the final model or checkpoint then does not fit, the learner releases the reserve
and writes again, which fits: the final model survives whatever filled the disk,
deterministically. Periodic saves that do not fit are skipped (said, training goes on)
without touching the reserve, so nothing can fill it before the end.
Only this file; it decides nothing about training.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("hetrl.learner")

RESERVE_FILE = ".hetrl-reserve"


class DiskReserve:
    """A file holding `size` bytes of the output disk for the outputs that matter."""

    def __init__(self, directory: Path, size: int) -> None:
        self.path = directory / RESERVE_FILE
        self.size = size
        self.held = False

    def take(self) -> bool:
        """Allocate the reserve (again); False if the disk has no room for it now."""
        if self.held:
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fd, 0, self.size)
                else:  # no fallocate: write the bytes
                    os.write(fd, b"\0" * self.size)
            finally:
                os.close(fd)
        except OSError as exc:
            self.path.unlink(missing_ok=True)
            log.debug("cannot reserve %d bytes in %s: %s", self.size, self.path.parent, exc)
            return False
        self.held = True
        return True

    def release(self) -> bool:
        """Give the space back for a write that matters; False if none was held."""
        if not self.held:
            return False
        self.path.unlink(missing_ok=True)
        self.held = False
        return True

    def close(self) -> None:
        """The run is over: the reserve goes."""
        self.release()
