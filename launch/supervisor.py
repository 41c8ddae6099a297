"""The one supervisor of rollout worker processes: `hetrl local`, an env host and the
learner host's own workers all start, restart and stop their workers through it.

A `Supervisor` spawns N workers, either on free ports, waiting for each to report its
address in a ready file, or on known ports without waiting. Polled by its caller, it
restarts on its port a worker that crashed, was killed or hung (any exit but OK and
UNHEALTHY, see `restartable`), only while the caller allows it, for as long as the
worker is useful: a long job on a leaky or crash-prone simulator keeps going. Each
worker has a budget of RESTARTS_PER_WINDOW restarts per RESTART_WINDOW seconds; past
it, and after every incarnation that died before it delivered any experience (its
progress file, rollout/serving.py), restarts back off (2, 4, ... up to MAX_BACKOFF
seconds). It gives up only when GIVE_UP_AFTER incarnations in a row died before
delivering anything: such a worker cannot live long enough to be of use. A worker whose
env keeps failing (EXIT_UNHEALTHY) is a failure at once, since a new process would fail
the same way. It stops them all (SIGTERM, then SIGKILL after a grace), or, once a
learner has finished, lets them exit and reports late exits as notes. It says what it
does through the caller's `say`. It never decides when a run ends: its caller watches
the learner or the control service.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hetrl.launch.processes import Child, spawn, stop_all, wait_all, wait_ready_file
from hetrl.rollout.errors import ChildFailedError
from hetrl.rollout.exits import EXIT_ENV_BROKEN, EXIT_OK, EXIT_UNHEALTHY
from hetrl.rollout.settings import WorkerSettings

# Restarts of one worker per window before they back off, the longest back-off, and how
# many incarnations in a row may die without delivering anything before it gives up.
RESTART_WINDOW = 600.0
RESTARTS_PER_WINDOW = 5
MAX_BACKOFF = 60.0
GIVE_UP_AFTER = 5
# After the learner's Stop, a healthy worker exits within its server's 2 s grace.
STOPPED_WORKER_EXIT = 5.0

SettingsFor = Callable[[int, int, str], WorkerSettings]
"""(index, port, ready_file) -> the settings of worker `index`; port 0 binds a free one,
an empty ready_file writes none."""


def restartable(code: int | None) -> bool:
    """Whether a worker that exited with `code` is restarted: not while it runs, not after
    a clean exit (a stop on purpose), not when its env keeps failing (unhealthy)."""
    return code not in (None, EXIT_OK, EXIT_UNHEALTHY, EXIT_ENV_BROKEN)


def _to_stderr(message: str) -> None:
    print(f"hetrl: {message}", file=sys.stderr)


@dataclasses.dataclass
class _Deaths:
    """One worker's deaths: when (within the window), how many in a row delivered
    nothing, and when the pending restart is due (None: none pending)."""

    times: collections.deque = dataclasses.field(default_factory=collections.deque)
    fruitless: int = 0
    total: int = 0
    restart_at: float | None = None

    def record(self, now: float, delivered: bool) -> None:
        self.times.append(now)
        while self.times and self.times[0] < now - RESTART_WINDOW:
            self.times.popleft()
        self.fruitless = 0 if delivered else self.fruitless + 1
        self.total += 1

    def backoff(self) -> float:
        """Seconds to wait before the restart: none while the worker is within its
        budget and delivering; 2, 4, 8, ... (at most MAX_BACKOFF) past it."""
        excess = max(self.fruitless, len(self.times) - RESTARTS_PER_WINDOW)
        return 0.0 if excess <= 0 else min(MAX_BACKOFF, 2.0 ** excess)


def last_error_line(log_tail: str) -> str:
    """The line of a worker's log that says why it died: its last ERROR record's first
    line (hetrl's own words), else the last exception's line."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if " ERROR " in line:
            return line.split(" ERROR ", 1)[1][:400]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            return line[:400]
    return lines[-1][:400] if lines else "(its log is empty)"


def death_cause(code: int | None, log_tail: str) -> str:
    """Why a worker exited with `code`: the signal that killed it (its log cannot know:
    its last error there is some earlier, handled one), else its log's last error line."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return last_error_line(log_tail)


class Supervisor:
    """Rollout worker processes of one host under one restart rule.

    Args:
        settings_for: the settings of each worker, given its index, port and ready file.
        run_dir: where each worker's settings, log and ready file go.
        env: the workers' environment (launch.processes.child_environment).
        name: workers are `<name>-<index>`, in process names, logs and messages.
        echo_host: when given, each worker's lines also reach this process's stdout
            prefixed `[<echo_host> <name>-<index>]` (a cluster host's CloudWatch stream).
        say: where restarts and late exits are told (default: `hetrl: ...` on stderr).
        new_session: start each worker out of the terminal's process group (see
            launch.processes.spawn), so that only its launcher decides when it stops.
    """

    def __init__(self, settings_for: SettingsFor, run_dir: Path, env: dict[str, str], *,
                 name: str = "worker", echo_host: str | None = None,
                 say: Callable[[str], None] = _to_stderr, new_session: bool = False) -> None:
        self.settings_for, self.run_dir, self.env = settings_for, run_dir, env
        self.new_session = new_session
        self.name, self.echo_host, self.say = name, echo_host, say
        self.workers: list[Child] = []
        """The current process of each worker (a restart replaces it in place)."""
        self.ports: list[int] = []
        self.restarts = 0
        self.deaths: list[_Deaths] = []

    def spawn(self, index: int, port: int, ready_file: str) -> Child:
        """Start the process of worker `index`: the one place a worker is started."""
        name = f"{self.name}-{index}"
        progress = self.progress_file(index)
        progress.unlink(missing_ok=True)  # this incarnation has delivered nothing yet
        settings = dataclasses.replace(self.settings_for(index, port, ready_file),
                                       progress_file=str(progress))
        # Central inference: the worker only steps envs (and imports no torch).
        module = ("hetrl.rollout.env_server" if settings.inference == "central"
                  else "hetrl.rollout.worker")
        if self.echo_host is None:
            return spawn(name, module, settings, self.run_dir, self.env,
                         new_session=self.new_session)
        return spawn(name, module, settings, self.run_dir, self.env,
                     echo=sys.__stdout__, echo_prefix=f"[{self.echo_host} {name}] ",
                     new_session=self.new_session)

    def progress_file(self, index: int) -> Path:
        """Where worker `index` says it has delivered experience (rollout/serving.py)."""
        return self.run_dir / f"{self.name}-{index}.progress"

    def start(self, ports: Sequence[int]) -> None:
        """Spawn worker i on ports[i], without waiting for it to listen."""
        for port in ports:
            self.ports.append(port)
            self.workers.append(self.spawn(len(self.workers), port, ""))

    def start_and_wait(self, count: int, timeout: float,
                       timeout_flag: str = "--startup-timeout") -> list[str]:
        """Spawn `count` workers on free ports (instead of `start`) and wait up to
        `timeout` s for each to report its address; return the addresses. Restarts
        reuse the same ports.

        Raises:
            ChildFailedError: a worker exited before it was ready, or was not in time.
        """
        ready = [self.run_dir / f"{self.name}-{i}.ready" for i in range(count)]
        for path in ready:
            path.unlink(missing_ok=True)
            self.ports.append(0)
            self.workers.append(self.spawn(len(self.workers), 0, str(path)))
        addresses = [wait_ready_file(w, path, timeout, timeout_flag)
                     for w, path in zip(self.workers, ready, strict=True)]
        self.ports = [int(address.rsplit(":", 1)[1]) for address in addresses]
        return addresses

    def poll(self, may_restart: Callable[[], bool] = lambda: True) -> list[int]:
        """Look at every worker once: note each that crashed, was killed or hung, and
        restart it on its port when its back-off has passed, as long as `may_restart()`
        (asked just before each restart) allows it. A worker that exited 0 was stopped on
        purpose and stays stopped.

        Returns:
            The indices of the workers restarted.

        Raises:
            ChildFailedError: a worker's env keeps failing, or GIVE_UP_AFTER incarnations
                of one worker in a row died before delivering anything; the message
                names the worker, its deaths and the line of its log that says why.
        """
        restarted = []
        now = time.monotonic()
        for i, worker in enumerate(self.workers):
            code = worker.exit_code()
            if code == EXIT_UNHEALTHY:
                rule = self.settings_for(i, self.ports[i], "")
                cause = last_error_line(worker.log_tail(400))
                if "--env-failure-rate" not in cause:  # e.g. NaN under --nonfinite fail
                    cause += (f" (--env-failure-rate {rule.env_failure_rate} over "
                              f"--env-failure-window {rule.env_failure_window})")
                raise ChildFailedError(f"{worker.name} is unhealthy: {cause}. Fix the env; "
                                       f"the traceback is in {worker.log_path}")
            if code == EXIT_ENV_BROKEN:
                raise ChildFailedError(
                    f"{worker.name} stopped: the env is broken, "
                    f"{last_error_line(worker.log_tail(200))} A restart cannot fix that; "
                    f"the traceback is in {worker.log_path}")
            if not restartable(code):
                continue
            while len(self.deaths) <= i:
                self.deaths.append(_Deaths())
            deaths = self.deaths[i]
            if deaths.restart_at is None:  # a death not seen before
                deaths.record(now, self.progress_file(i).exists())
                why = death_cause(code, worker.log_tail(400))
                if deaths.fruitless >= GIVE_UP_AFTER:
                    raise ChildFailedError(
                        f"{worker.name} died {deaths.fruitless} times in a row before it "
                        f"delivered any experience ({deaths.total} deaths in all; last exit "
                        f"code {code}): it cannot live long enough to be of use. Its last "
                        f"error: {why} (log: {worker.log_path})")
                delay = deaths.backoff()
                deaths.restart_at = now + delay
                self.say(f"{worker.name} exited with code {code} ({why}); restarting it"
                         + (f" in {delay:.0f} s" if delay else "")
                         + f" ({len(deaths.times)} deaths in the last "
                         f"{RESTART_WINDOW / 60:.0f} min, {deaths.total} in all)")
            if now < deaths.restart_at:
                continue
            if not may_restart():
                break
            deaths.restart_at = None
            self.restarts += 1
            self.workers[i] = self.spawn(i, self.ports[i], "")
            restarted.append(i)
        return restarted

    def running(self) -> int:
        """How many workers are running now."""
        return sum(worker.exit_code() is None for worker in self.workers)

    def stop(self, grace: float) -> None:
        """SIGTERM every running worker, SIGKILL those still running after `grace` s."""
        stop_all(self.workers, grace)

    def finish(self, grace: float) -> None:
        """The learner finished, so the run's outputs are complete. Workers it stopped
        exit by themselves; any still running after that (one that crashed or hung near
        the end and never heard the Stop) gets SIGTERM, then SIGKILL after `grace`. A
        worker's exit after the learner's success is told as a note, never a failure."""
        wait_all(self.workers, min(grace, STOPPED_WORKER_EXIT))
        late = [w for w in self.workers if w.exit_code() is None]
        if late:
            self.say(f"{', '.join(w.name for w in late)} still running after the learner "
                     "finished; stopping them")
            stop_all(late, grace)
        for worker in self.workers:
            code = worker.exit_code()
            if code not in (0, None) and worker not in late:
                self.say(f"note: {worker.name} exited with code {code} as training ended "
                         "(the model and metrics are complete)")
