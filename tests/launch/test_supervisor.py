"""The one supervisor of worker processes, with real child processes standing in for
workers: which exits it restarts, on which port, within which budget."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hetrl.launch.processes import Child, spawn_command
from hetrl.launch.supervisor import MAX_WORKER_RESTARTS, Supervisor
from hetrl.rollout.errors import ChildFailedError
from hetrl.rollout.settings import WorkerSettings
from tests.helpers import wait_for


def _supervisor(tmp_path: Path, exits: list[int | None]) -> tuple[Supervisor, list, list]:
    """Worker i exits with exits[i] at once (None: runs until stopped); every start and
    every message is recorded."""
    started: list[tuple[int, int]] = []
    said: list[str] = []

    class StandIns(Supervisor):
        def spawn(self, index: int, port: int, ready_file: str) -> Child:
            started.append((index, port))
            code = "import time; time.sleep(600)" if exits[index] is None else \
                f"raise SystemExit({exits[index]})"
            return spawn_command(f"worker-{index}", [sys.executable, "-c", code],
                                 dict(os.environ), None)

    supervisor = StandIns(lambda *_: WorkerSettings(env_failure_rate=0.3), tmp_path,
                           dict(os.environ), say=said.append)
    return supervisor, started, said


def _exited(supervisor: Supervisor) -> bool:
    return all(w.exit_code() is not None for w in supervisor.workers[:-1])


def test_crashed_workers_restart_on_their_port_until_the_budget_is_spent(tmp_path) -> None:
    supervisor, started, said = _supervisor(tmp_path, [5, 1, None])
    try:
        supervisor.start([7001, 7002, 7003])
        with pytest.raises(ChildFailedError, match=f"after {MAX_WORKER_RESTARTS} worker"):
            while True:
                wait_for(lambda: _exited(supervisor), 30, "the crashing workers to exit")
                supervisor.poll()
        restarts = started[3:]
        assert len(restarts) == MAX_WORKER_RESTARTS
        assert all(port == 7000 + index + 1 for index, port in restarts)  # the same port
        assert said[0] == f"worker-0 exited with code 5; restarting it (1/{MAX_WORKER_RESTARTS})"
    finally:
        supervisor.stop(5.0)
    assert supervisor.running() == 0


def test_a_clean_exit_stays_stopped_and_nothing_restarts_while_the_caller_forbids_it(
    tmp_path,
) -> None:
    supervisor, started, said = _supervisor(tmp_path, [0, 5, None])
    try:
        supervisor.start([0, 0, 0])
        wait_for(lambda: _exited(supervisor), 30, "the first two workers to exit")
        assert supervisor.poll(may_restart=lambda: False) == []
        assert supervisor.poll() == [1]
        assert [index for index, _ in started] == [0, 1, 2, 1] and supervisor.restarts == 1
    finally:
        supervisor.stop(5.0)


def test_an_unhealthy_worker_is_a_failure_at_once(tmp_path) -> None:
    supervisor, started, _ = _supervisor(tmp_path, [4, None])
    try:
        supervisor.start([0, 0])
        wait_for(lambda: _exited(supervisor), 30, "the unhealthy worker to exit")
        with pytest.raises(ChildFailedError, match=r"worker-0 is unhealthy.*rate 0\.3"):
            supervisor.poll()
        assert len(started) == 2
    finally:
        supervisor.stop(5.0)
