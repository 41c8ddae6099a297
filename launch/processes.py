"""Start hetrl roles as child processes and make sure none outlives the launcher.

Children are plain `python -m <module> SETTINGS_JSON` processes (settings as JSON, never
pickle), with the shared token in their environment, their logs in files, and
PR_SET_PDEATHSIG (set by each child itself, rollout.lifetime) so the kernel stops them
if the launcher dies without cleaning up.
`stop_all` sends SIGTERM, waits a bounded grace, then SIGKILLs what is left. What to do
when a child exits is not decided here: launch.supervisor restarts workers, and each
launcher watches its own learner or hosts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from hetrl.launch.logs import pump
from hetrl.rollout.errors import ChildFailedError
from hetrl.rollout.lifetime import PARENT_ENV
from hetrl.rollout.settings import to_json
from hetrl.rollout.userpath import USER_PATH_ENV


@dataclasses.dataclass
class Child:
    """A started role process."""

    name: str
    process: subprocess.Popen
    log_path: Path | None
    log_pump: threading.Thread | None = None
    """Copies the child's piped output to its log file and an echo stream (see launch.logs)."""

    def exit_code(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = 25) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


# -P (Python >= 3.11): `-m` does not put the current directory on the child's path before
# hetrl is imported; the child adds it right after (rollout.userpath).
PYTHON = [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]


def child_environment(token: str) -> dict[str, str]:
    """The parent's environment, plus the token, the parent's import path without the
    current directory, and the current directory as the user's folder: a child imports
    hetrl first and puts the user's folder first after that (rollout.userpath), so a
    user's module is found as `python -m` would find it and no file of the user's can
    replace hetrl's code."""
    env = dict(os.environ)
    env["HETRL_TOKEN"] = token
    cwd = Path.cwd().resolve()
    paths = [p for p in sys.path if p and Path(p).exists() and Path(p).resolve() != cwd]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env[USER_PATH_ENV] = str(cwd)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def spawn(
    name: str, module: str, settings: object, run_dir: Path, env: dict[str, str],
    log_to_file: bool = True, echo: TextIO | None = None, echo_prefix: str = "",
    new_session: bool = False,
) -> Child:
    """Start `python -m module settings.json` with its output in run_dir/logs/name.log
    (and each line, prefixed with `echo_prefix`, in `echo` too when given). With
    `new_session`, the child is out of the terminal's process group: a Ctrl-C reaches
    only the launcher, which then stops its children in order."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / f"{name}.json"
    config.write_text(to_json(settings))
    log_path = run_dir / "logs" / f"{name}.log" if log_to_file else None
    return spawn_command(name, [*PYTHON, "-m", module, str(config)], env, log_path,
                         echo=echo, echo_prefix=echo_prefix, new_session=new_session)


def spawn_command(
    name: str, command: list[str], env: dict[str, str], log_path: Path | None,
    echo: TextIO | None = None, echo_prefix: str = "", new_session: bool = False,
    talk: bool = False,
) -> Child:
    """Start `command` with stdin closed and its output in log_path (None: inherited);
    with `echo`, its output is piped and each line also written there, prefixed. With
    `talk` (the benchmarks' children), stdin and stdout are text pipes for the caller to
    converse through, and only stderr goes to log_path."""
    stdout = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if echo is None:
            stdout = log_path.open("ab")
    process = subprocess.Popen(
        command,
        env=dict(env, **{PARENT_ENV: str(os.getpid())}),  # see rollout.lifetime
        stdin=subprocess.PIPE if talk else subprocess.DEVNULL,
        stdout=subprocess.PIPE if (talk or echo is not None) else stdout,
        stderr=stdout if talk else (
            subprocess.STDOUT if (stdout or echo is not None) else None),
        start_new_session=new_session, text=talk or None,
    )
    if stdout is not None:
        stdout.close()
    log_pump = None
    if echo is not None and process.stdout is not None:
        log_pump = pump(process.stdout, log_path, echo_prefix, echo)
    return Child(name, process, log_path, log_pump)


def wait_ready_file(child: Child, path: Path, timeout: float,
                    timeout_flag: str = "--startup-timeout") -> str:
    """Wait for a worker's ready file; return its address. `timeout_flag` is the setting
    the message names.

    Raises:
        ChildFailedError: the child exited first, or the timeout passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())["address"]
        code = child.exit_code()
        if code is not None:
            from hetrl.launch.supervisor import last_error_line

            where = (f"; the traceback is in {child.log_path}" if child.log_path is not None
                     else "")
            raise ChildFailedError(f"{child.name} exited with code {code} before it was "
                                   f"ready: {last_error_line(child.log_tail(200))}{where}")
        time.sleep(0.05)
    raise ChildFailedError(
        f"{child.name} was not ready within {timeout:.0f} s ({timeout_flag}):\n"
        f"{child.log_tail()}"
    )


def stop_all(children: list[Child], grace: float) -> None:
    """SIGTERM every running child, wait up to `grace` s, then SIGKILL the rest."""
    for child in children:
        if child.exit_code() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait(5.0)
    for child in children:  # their last lines reach the files before anyone reads them
        if child.log_pump is not None:
            child.log_pump.join(max(0.1, min(2.0, deadline - time.monotonic())))


def kill_all(children: list[Child]) -> None:
    """SIGKILL every running child now (a second Ctrl-C: nothing more is waited for)."""
    for child in children:
        if child.exit_code() is None:
            child.process.kill()


def wait_all(children: list[Child], timeout: float) -> bool:
    """Wait up to `timeout` s for every child to exit by itself; True if all did."""
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True
