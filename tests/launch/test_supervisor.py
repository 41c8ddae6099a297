"""The one supervisor of worker processes, with real child processes standing in for
workers: which exits it restarts, on which port, within which budget."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from hetrl.launch import supervisor as supervisor_module
from hetrl.launch.processes import Child, spawn_command
from hetrl.launch.supervisor import GIVE_UP_AFTER, Supervisor
from hetrl.rollout.errors import ChildFailedError
from hetrl.rollout.settings import WorkerSettings
from tests.helpers import wait_for


def _supervisor(tmp_path: Path, exits: list[int | None], delivers: bool = False
                ) -> tuple[Supervisor, list, list]:
    """Worker i exits with exits[i] at once (None: runs until stopped), first saying it
    delivered experience when `delivers`; every start and every message is recorded."""
    started: list[tuple[int, int]] = []
    said: list[str] = []

    class StandIns(Supervisor):
        def spawn(self, index: int, port: int, ready_file: str) -> Child:
            started.append((index, port))
            progress = self.progress_file(index)
            progress.unlink(missing_ok=True)
            code = "import time; time.sleep(600)" if exits[index] is None else (
                f"open({str(progress)!r}, 'w').write('{{}}'); " if delivers else "") + (
                f"print('RuntimeError: simulator leaked'); raise SystemExit({exits[index]})")
            return spawn_command(f"worker-{index}", [sys.executable, "-c", code],
                                 dict(os.environ), tmp_path / f"worker-{index}.log")

    supervisor = StandIns(lambda *_: WorkerSettings(env_failure_rate=0.3), tmp_path,
                           dict(os.environ), say=said.append)
    return supervisor, started, said


def _exited(supervisor: Supervisor) -> bool:
    return all(w.exit_code() is not None for w in supervisor.workers[:-1])


@pytest.fixture
def quick_backoff(monkeypatch):
    """Back-offs of a fraction of a second, and a budget of 2 restarts per window."""
    monkeypatch.setattr(supervisor_module, "MAX_BACKOFF", 0.05)
    monkeypatch.setattr(supervisor_module, "RESTARTS_PER_WINDOW", 2)


def _poll_until(supervisor: Supervisor, restarts: int, timeout: float = 60) -> None:
    def enough() -> bool:
        supervisor.poll()
        return supervisor.restarts >= restarts
    wait_for(enough, timeout, f"{restarts} restarts")


def test_a_worker_that_keeps_delivering_is_restarted_however_often_it_dies(
        tmp_path, quick_backoff) -> None:
    supervisor, started, said = _supervisor(tmp_path, [5, 1, None], delivers=True)
    try:
        supervisor.start([7001, 7002, 7003])
        _poll_until(supervisor, 12)  # far past the old budget of 3 for the whole run
        restarts = started[3:]
        assert all(port == 7000 + index + 1 for index, port in restarts)  # the same port
        # (worker-1 dies at once too: under load either death may be seen first)
        assert next(line for line in said if line.startswith("worker-0")) == (
            "worker-0 exited with code 5 (RuntimeError: simulator leaked); "
            "restarting it (1 deaths in the last 10 min, 1 in all)")
        # Past 2 in the window, restarts back off.
        assert any(" in 0 s " in line or "restarting it in" in line for line in said), said
    finally:
        supervisor.stop(5.0)
    assert supervisor.running() == 0


def test_a_worker_that_never_delivers_is_given_up_with_its_cause(tmp_path,
                                                                 quick_backoff) -> None:
    supervisor, started, said = _supervisor(tmp_path, [5, None])
    try:
        supervisor.start([0, 0])
        with pytest.raises(ChildFailedError) as failure:
            _poll_until(supervisor, 10**6)
        message = str(failure.value)
        assert f"worker-0 died {GIVE_UP_AFTER} times in a row before it delivered" in message
        assert "RuntimeError: simulator leaked" in message and "worker-0.log" in message
        assert len(started) == 1 + GIVE_UP_AFTER  # the first start and 4 restarts
    finally:
        supervisor.stop(5.0)


def test_a_clean_exit_stays_stopped_and_nothing_restarts_while_the_caller_forbids_it(
    tmp_path, quick_backoff,
) -> None:
    supervisor, started, said = _supervisor(tmp_path, [0, 5, None])
    try:
        supervisor.start([0, 0, 0])
        wait_for(lambda: _exited(supervisor), 30, "the first two workers to exit")
        assert supervisor.poll(may_restart=lambda: False) == []
        time.sleep(0.1)  # past the back-off (0.05 s), which a real poll loop waits out
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


def test_a_killed_worker_is_said_to_be_killed_not_blamed_on_its_last_logged_error() -> None:
    from hetrl.launch.supervisor import death_cause

    log = "2026-12-03 12:00:00,000 hetrl.worker WARNING env 3 failed: RuntimeError: fault"
    assert death_cause(-9, log) == "killed by SIGKILL"
    assert death_cause(-15, log) == "killed by SIGTERM"
    assert death_cause(1, log + "\nRuntimeError: boom") == "RuntimeError: boom"
