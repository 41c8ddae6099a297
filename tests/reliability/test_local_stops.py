"""Faults 7 and 8 on a real `hetrl local` run: a learner that stops taking fragments
(SIGSTOP: the cleanest slow learner) while the workers' memory and CPU are sampled from
/proc, and SIGTERM to each role separately. Each test prints what it measured;
docs/reliability.md quotes the figures."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from hetrl.learner.checkpoint import checkpoints
from tests.helpers import processes_mentioning, wait_for
from tests.reliability.test_process_faults import count, start, step, worker_pid

MIB = 1 << 20


def rss_and_cpu(pid: int) -> tuple[int, float]:
    """Resident memory (bytes, VmRSS) and CPU time used so far (s) of a process."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def learner_pid(out: Path) -> int:
    pids = processes_mentioning(str(out / "launch" / "learner.json"))
    assert len(pids) == 1, pids
    return pids[0]


def newest_checkpoint(out: Path) -> dict:
    path = checkpoints(out / "checkpoints")[0]
    assert not list((out / "checkpoints").glob(".*.tmp"))  # written atomically
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_workers_wait_at_their_credits_with_flat_memory_under_a_stalled_learner(
    measured, tmp_path: Path,
) -> None:
    out = tmp_path / "slow"
    # Long keepalive: the stalled learner must look slow, not gone, for the whole window.
    proc, log = start(out, "--workers", "2", "--envs-per-worker", "8", "--total-steps",
                      "100000000", "--credits-per-worker", "2", "--keepalive-time", "60",
                      "--keepalive-timeout", "60")
    try:
        wait_for(lambda: step(out) > 20_000, 120, "training to warm up")
        workers = [worker_pid(out, i) for i in range(2)]
        busy_cpu = [rss_and_cpu(p)[1] for p in workers]
        time.sleep(3.0)  # a sampling interval, not a synchronisation
        busy_cpu = [rss_and_cpu(p)[1] - c for p, c in zip(workers, busy_cpu, strict=True)]
        learner = learner_pid(out)
        os.kill(learner, signal.SIGSTOP)
        samples: list[list[tuple[int, float]]] = []
        for _ in range(21):  # one sample a second for 20 s
            samples.append([rss_and_cpu(p) for p in workers])
            time.sleep(1.0)
        os.kill(learner, signal.SIGCONT)
        resumed_from = step(out)
        wait_for(lambda: step(out) > resumed_from + 2000, 60, "training to resume")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    warm = samples[3:]  # the credits' fragments are sent in the first second or two
    for i in range(2):
        rss = [s[i][0] for s in warm]
        cpu = warm[-1][i][1] - warm[0][i][1]
        measured(f"worker {i}: RSS over {len(warm)} s with the learner stalled: min "
              f"{min(rss) / MIB:.1f} MiB, max {max(rss) / MIB:.1f} MiB, growth "
              f"{(rss[-1] - rss[0]) / MIB:+.2f} MiB; CPU {cpu:.2f} s in that window "
              f"(vs {busy_cpu[i]:.2f} s in 3 s while training)")
        assert max(rss) - min(rss) < 10 * MIB
        assert cpu < 0.5  # blocked on its credits, not sampling
    assert count(log, "restarting") == 0


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_gracefully_and_exits_0(measured, tmp_path: Path) -> None:
    out = tmp_path / "a"
    proc, log = start(out, "--workers", "2", "--total-steps", "100000000")
    try:
        wait_for(lambda: step(out) > 5000, 120, "training to start")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # the launcher alone, as a scheduler does
        code = proc.wait(60)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    state = newest_checkpoint(out)
    measured(f"SIGTERM launcher: exit {code} after {elapsed:.1f} s (grace 20 s); checkpoint "
          f"at step {state['global_step']}")
    assert code == 0, log.read_text()[-3000:]
    assert summary["outcome"] == "stopped: signal SIGTERM"
    assert state["global_step"] == summary["global_step"]
    assert summary["workers_lost"] == []  # both workers were stopped, none lost
    assert elapsed < 20
    wait_for(lambda: processes_mentioning(str(out)) == [], 30, "children to exit")


@pytest.mark.slow
def test_sigterm_to_a_worker_then_to_the_learner(measured, tmp_path: Path) -> None:
    out = tmp_path / "bc"
    proc, log = start(out, "--workers", "2", "--total-steps", "100000000",
                      "--connect-timeout", "3")
    try:
        wait_for(lambda: count(log, "streaming from worker") == 2 and step(out) > 0, 120,
                 "training on both workers")
        # (c) one worker alone: it exits 0, which the launcher takes for an operator's
        # stop (no restart); the learner trains on with the other.
        worker = worker_pid(out, 1)
        sent = time.monotonic()
        os.kill(worker, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{worker}").exists()
                 or "State:\tZ" in Path(f"/proc/{worker}/status").read_text(), 30,
                 "the worker to exit")
        worker_stop = time.monotonic() - sent
        at = step(out)
        wait_for(lambda: step(out) > at + 5000, 60, "training on the other worker")
        wait_for(lambda: count(log, "ERROR lost worker") == 1, 60,
                 "the learner to give up on the stopped worker (--connect-timeout 3)")
        # (b) the learner alone: it checkpoints, stops its workers and exits 0; the
        # launcher then exits 0.
        sent = time.monotonic()
        os.kill(learner_pid(out), signal.SIGTERM)
        code = proc.wait(60)
        learner_stop = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    state = newest_checkpoint(out)
    measured(f"SIGTERM worker 1: gone after {worker_stop:.1f} s, not restarted, training "
          f"went on; SIGTERM learner: launcher exit {code} after {learner_stop:.1f} s, "
          f"checkpoint at step {state['global_step']}; lost {summary['workers_lost']}")
    assert code == 0, log.read_text()[-3000:]
    assert "worker 1 stopped (signal SIGTERM)" in (out / "launch" / "logs" /
                                                   "worker-1.log").read_text()
    assert count(log, "restarting") == 0
    assert summary["outcome"] == "stopped: signal SIGTERM"
    assert state["global_step"] == summary["global_step"]
    # The worker lost for good is in the summary and the report, with what it held.
    [lost] = summary["workers_lost"]
    assert lost["worker_id"] == 1 and 0 <= lost["fragments_in_flight"] <= 2, lost
    assert summary["fragments_lost_in_flight"] == lost["fragments_in_flight"]
    assert "workers lost for good" in (out / "report" / "report.md").read_text()
    assert learner_stop < 20
    wait_for(lambda: processes_mentioning(str(out)) == [], 30, "children to exit")
