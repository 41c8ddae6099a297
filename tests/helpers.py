"""Helpers shared by the multi-process tests: wait on a condition, find leftover processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port nothing listens on now (for a command that must be given one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):
    """Poll `condition` until truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def processes_mentioning(text: str) -> list[int]:
    """PIDs (other than ours) whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if text in cmdline and "State:\tZ" not in status:
            found.append(int(entry.name))
    return found


def hetrl(*args: str, **kwargs) -> subprocess.Popen:
    """Start the hetrl CLI (as `python -m hetrl.launch`) from the repository root."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **kwargs.pop("env", {}))
    return subprocess.Popen(
        [sys.executable, "-m", "hetrl.launch", *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs,
    )


def learns_and_plays(out: Path, env: str, inference: str, steps: int, threshold: float,
                     random_play: float, **settings) -> None:
    """`hetrl local` (2 workers x 8 envs, seed 1, and `settings`) trains `env` to
    mean(100) >= threshold within `steps` (central inference keeping lag 0 or 1), and
    the kept best policy plays 5 deterministic episodes at that bar through `load_policy`."""
    from hetrl.launch import run_local
    from hetrl.rollout.evaluate import evaluate, load_policy

    result = run_local(env=env, workers=2, envs_per_worker=8, total_steps=steps, seed=1,
                       inference=inference, out=str(out), progress=False, report=False,
                       **settings)
    assert result.ok, result.summary
    assert result.summary["mean_return_100"] >= threshold, (
        f"{env} ({inference} inference) ended at {result.summary['mean_return_100']:.2f}, "
        f"random play scores ~{random_play}")
    if inference == "central":
        assert set(result.summary["policy_lag_histogram"]) <= {"0", "1"}
    played = evaluate(load_policy(out, "best"), episodes=5, deterministic=True, seed=10)
    assert played.mean_return >= threshold, played.summary()
