"""Tie a hetrl child process's life to the launcher that started it.

The launcher puts its PID in HETRL_PARENT_PID; the child's entry point calls
`die_with_parent()` first thing, which asks Linux for SIGTERM when the parent dies
(PR_SET_PDEATHSIG) and ends at once if the parent is already gone. This runs after
exec, in the child's own main, because code run between fork and exec (subprocess's
preexec_fn) can deadlock when the parent has threads, and gRPC always has some.

`catch_stop_early()` is for a process that may be PID 1 of a container (a SageMaker host
run as `exec python3 launcher.py`): the kernel drops a signal sent to a namespace's init
process unless it has a handler, so a SIGTERM that arrived while heavy modules were still
importing would be lost. It records the signal until the role installs its own handlers
and asks `early_stop()`. Standard library only, so it can run before anything else.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from pathlib import Path

from hetrl.rollout.userpath import user_modules_importable

PARENT_ENV = "HETRL_PARENT_PID"
_PR_SET_PDEATHSIG = 1


_early_signals: list[int] = []


def catch_stop_early() -> None:
    """Record SIGTERM from now on, until a role installs its own handler."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: _early_signals.append(signum))


def early_stop() -> str | None:
    """"signal SIGTERM" if one arrived while only `catch_stop_early`'s handler was set."""
    return f"signal {signal.Signals(_early_signals[0]).name}" if _early_signals else None


def die_with_parent() -> None:
    """If a hetrl launcher started this process, receive SIGTERM when it dies."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    # getppid() is 0 for the first process of a PID namespace (its parent lives outside,
    # e.g. a host started under `unshare --pid`): nothing to compare, the request stands.
    if os.getppid() not in (0, int(parent)):  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
"""Every hetrl process logs its lines alike."""


def start_child(argv: list[str] | None = None) -> Path:
    """What a launcher's child (worker, learner, evaluator) does first in its main: die
    with the launcher, put the user's modules on the path (after hetrl's own are
    imported), log as the launcher does; return the settings file the launcher wrote."""
    die_with_parent()  # first: no child outlives its launcher
    user_modules_importable()  # the user's --env / --policy modules
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    return Path(argv[0])


def exit_now(code: int) -> None:
    """End a child process with `code` once its work is written: flush the streams and
    the logs, then skip the interpreter's teardown (joining gRPC's and TensorBoard's
    threads, unloading torch), which took most of a second after the last line. Only
    for a process whose outputs are all closed by the time it calls this."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or the reader went away
            pass
    os._exit(code)
