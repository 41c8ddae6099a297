"""Tie a hetrl child process's life to the launcher that started it.

The launcher puts its PID in HETRL_PARENT_PID; the child's entry point calls
`die_with_parent()` first thing, which asks Linux for SIGTERM when the parent dies
(PR_SET_PDEATHSIG) and ends at once if the parent is already gone. This runs after
exec, in the child's own main, because code run between fork and exec (subprocess's
preexec_fn) can deadlock when the parent has threads, and gRPC always has some.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "HETRL_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """If a hetrl launcher started this process, receive SIGTERM when it dies."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
