"""Faults 2, 3 and 4 on a real `hetrl local` run: a worker SIGKILLed, a worker frozen with
SIGSTOP (a host that vanishes without closing its sockets), an env that hangs. Each
test prints what it measured; docs/reliability.md quotes the figures."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, processes_mentioning, wait_for


def start(out: Path, *args: str, env: dict[str, str] | None = None):
    # The launcher's log lives beside --out: a run refuses an --out that holds files.
    out.parent.mkdir(parents=True, exist_ok=True)
    log = (out.parent / f"{out.name}.launcher.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetrl.launch", "local", "--out", str(out), "--no-progress", *args],
        cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, out.parent / f"{out.name}.launcher.log"


def step(out: Path) -> int:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["global_step"] if lines else 0


def count(log: Path, pattern: str) -> int:
    return len(re.findall(pattern, log.read_text()))


def worker_pid(out: Path, i: int) -> int:
    pids = processes_mentioning(str(out / "launch" / f"worker-{i}.json"))
    assert len(pids) == 1, pids
    return pids[0]


@pytest.mark.slow
def test_killed_and_frozen_workers_rejoin_and_nothing_is_trained_twice(
        measured, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc, log = start(out, "--workers", "2", "--envs-per-worker", "4", "--total-steps",
                      "100000000", "--keepalive-time", "1", "--keepalive-timeout", "2")
    try:
        wait_for(lambda: step(out) > 0, 120, "training to start")
        # Fault 3: SIGKILL worker 0 mid-stream.
        os.kill(worker_pid(out, 0), signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: count(log, r"worker-0 exited with code -9 \(.*\); restarting") == 1, 60,
                 "the launcher to restart worker 0")
        wait_for(lambda: count(log, r"streaming from worker 0 ") >= 2, 90,
                 "the learner to stream from the restarted worker 0")
        rejoin_kill = time.monotonic() - killed
        # Fault 4: freeze worker 1 without closing its sockets.
        frozen_pid = worker_pid(out, 1)
        lost_before = count(log, r"lost worker")
        os.kill(frozen_pid, signal.SIGSTOP)
        frozen = time.monotonic()
        step_at_freeze = step(out)
        wait_for(lambda: count(log, r"lost worker") > lost_before, 60,
                 "keepalive to detect the frozen worker")
        detect = time.monotonic() - frozen
        wait_for(lambda: step(out) > step_at_freeze + 2000, 60,
                 "training to continue on the other worker")
        os.kill(frozen_pid, signal.SIGCONT)
        thawed = time.monotonic()
        wait_for(lambda: count(log, r"streaming from worker 1 ") >= 2, 90,
                 "the thawed worker 1 to rejoin")
        rejoin_stop = time.monotonic() - thawed
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    counters = {k: summary[k] for k in ("reconnects", "sequence_gaps", "fragments_duplicate",
                                        "fragments_malformed")}
    measured(f"SIGKILL worker: restarted and streaming again after {rejoin_kill:.1f} s; "
          f"SIGSTOP worker: detected after {detect:.1f} s (keepalive 1 s + 2 s), rejoined "
          f"{rejoin_stop:.1f} s after SIGCONT; counters {counters}")
    assert detect < 1 + 2 + 5  # keepalive time + timeout, with slack for a loaded machine
    assert summary["reconnects"] >= 2
    assert summary["fragments_duplicate"] == 0  # no sequence trained twice
    assert summary["fragments_malformed"] == 0  # includes fragments of a foreign incarnation
    wait_for(lambda: processes_mentioning(str(out)) == [], 30, "children to exit")


@pytest.mark.slow
def test_hung_env_restarts_its_worker_while_training_goes_on(measured, tmp_path: Path) -> None:
    out, flag = tmp_path / "hang", tmp_path / "hang.flag"
    proc, log = start(out, "--env", "tests.reliability.envs:HangsOnce", "--workers", "2",
                      "--envs-per-worker", "2", "--fragment-length", "16", "--total-steps",
                      "12000", "--step-timeout", "3", env={"HETRL_TEST_HANG_FLAG": str(flag)})
    try:
        wait_for(flag.exists, 120, "an env to hang")
        step_at_hang = step(out)
        wait_for(lambda: count(log, r"exited with code 5 \(.*\); restarting") == 1, 60,
                 "the watchdog to end the hung worker")
        detect = time.time() - float(flag.read_text())
        assert proc.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    measured(f"hung env: worker exited {detect:.1f} s after the hang (--step-timeout 3); "
          f"step at hang {step_at_hang}, final {summary['global_step']}, "
          f"reconnects {summary['reconnects']}, duplicates {summary['fragments_duplicate']}")
    assert detect < 3 + 6
    assert summary["outcome"] == "finished" and summary["global_step"] >= 12000
    assert summary["fragments_duplicate"] == 0
    assert "is hung" in (out / "launch" / "logs").joinpath(
        f"worker-{0 if 'worker-0 exited' in log.read_text() else 1}.log").read_text()


@pytest.mark.slow
def test_worker_hung_at_the_end_never_delays_the_model_and_the_run_exits_0(
        measured, tmp_path: Path) -> None:
    """One worker's env hangs for 60 s (under --step-timeout, so no watchdog) while the
    other finishes the run: the model and checkpoint are written as training ends, the
    hung stream is closed after the bounded final Stop, and the run exits 0."""
    out, flag = tmp_path / "hang-end", tmp_path / "hang.flag"
    proc, log = start(out, "--env", "tests.reliability.envs:HangsFor", "--workers", "2",
                      "--envs-per-worker", "2", "--fragment-length", "16", "--total-steps",
                      "3000", "--shutdown-grace", "2",
                      env={"HETRL_TEST_HANG_FLAG": str(flag), "HETRL_TEST_HANG_SECONDS": "60"})
    try:
        wait_for(flag.exists, 120, "an env to hang")
        assert proc.wait(120) == 0, log.read_text()[-3000:]
        ended = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    finishing = (out / "launch" / "learner.finishing").stat().st_mtime
    model = (out / "model.safetensors").stat().st_mtime
    summary = json.loads((out / "summary.json").read_text())
    measured(f"worker hung at the end: model written {model - finishing:.2f} s after training "
          f"ended; launcher exit 0 {ended - finishing:.1f} s after it; hang began "
          f"{finishing - float(flag.read_text()):.1f} s before it; not stopped: "
          f"{summary['workers_not_stopped']}")
    assert float(flag.read_text()) + 60 > ended  # the env was still hung throughout
    assert model - finishing < 2.0  # was ~12 s: the final Stop waited on the hung stream
    assert len(summary["workers_not_stopped"]) == 1
    assert summary["outcome"] == "finished" and summary["global_step"] >= 3000
    wait_for(lambda: processes_mentioning(str(out)) == [], 30, "children to exit")


@pytest.mark.slow
def test_every_worker_stalling_is_warned_while_it_happens_and_judged_a_stall(
        measured, tmp_path: Path) -> None:
    """Every worker's env hangs for 20 s (under --step-timeout): the learner warns while
    it happens (after 10 s without a fragment from anyone) and the verdict calls it a
    stall, not a shortage of workers ("add about 18 more workers", as it used to)."""
    out, flag = tmp_path / "stall", tmp_path / "hang.flag"
    proc, log = start(out, "--env", "tests.reliability.envs:EveryWorkerHangsFor",
                      "--workers", "2", "--envs-per-worker", "2", "--fragment-length", "16",
                      "--total-steps", "2000",
                      env={"HETRL_TEST_HANG_FLAG": str(flag), "HETRL_TEST_HANG_SECONDS": "20"})
    try:
        wait_for(flag.exists, 120, "the envs to hang")
        wait_for(lambda: "every worker is stalled" in log.read_text(), 30,
                 "the learner to warn about the stall")
        warned = time.time() - float(flag.read_text())
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    measured(f"every worker hung 20 s: warned {warned:.1f} s after the hang began; stalled "
          f"{summary['stalled_seconds']} s; verdict {summary['verdict']}: "
          f"{summary['verdict_text']}")
    assert warned < 20  # while it happened
    assert summary["stalled_seconds"] >= 10
    assert summary["verdict"] == "stalled", summary["verdict_text"]
    assert "arrive again" in log.read_text()


def _log_times(path: Path, pattern: str) -> list[float]:
    """Wall times of the log lines matching `pattern` (asctime format)."""
    import datetime

    times = []
    for line in path.read_text().splitlines():
        if re.search(pattern, line):
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            times.append(stamp.timestamp())
    return times


@pytest.mark.slow
def test_workers_notice_a_frozen_learner_within_the_keepalive_bound(
        measured, tmp_path: Path) -> None:
    """SIGSTOP the learner for 8 s with keepalive 1 s + 2 s: each worker's stream ends
    within that bound (it used to survive a 25 s freeze unnoticed: grpcio timed out the
    server's keepalive pings after its general 60 s ping timeout), and on SIGCONT the
    learner, whose own pings timed out meanwhile, reconnects with fresh weights and
    credits; training goes on and nothing is trained twice; the learner says it was the
    one frozen."""
    out = tmp_path / "frozen"
    proc, log = start(out, "--workers", "2", "--envs-per-worker", "2", "--total-steps",
                      "100000000", "--keepalive-time", "1", "--keepalive-timeout", "2")
    worker_logs = [out / "launch" / "logs" / f"worker-{i}.log" for i in range(2)]
    try:
        wait_for(lambda: count(log, "streaming from worker") == 2 and step(out) > 0, 120,
                 "training on both workers")
        learner = processes_mentioning(str(out / "launch" / "learner.json"))[0]
        os.kill(learner, signal.SIGSTOP)
        frozen = time.time()
        wait_for(lambda: time.time() > frozen + 8, 10, "8 s of freeze")
        os.kill(learner, signal.SIGCONT)
        thawed = time.time()
        wait_for(lambda: count(log, "streaming from worker") >= 4, 60,
                 "the learner to stream from both workers again")
        rejoined = time.time() - thawed
        at = step(out)
        wait_for(lambda: step(out) > at + 2000, 60, "training to go on")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ended = [[round(t - frozen, 1) for t in _log_times(w, "stream ended without a Stop")]
             for w in worker_logs]
    summary = json.loads((out / "summary.json").read_text())
    measured(f"learner frozen 8 s: workers' streams ended {ended} s after SIGSTOP (keepalive "
          f"1 s + 2 s); both streaming again {rejoined:.1f} s after SIGCONT; duplicates "
          f"{summary['fragments_duplicate']}")
    assert all(e and e[0] < 1 + 2 + 2 for e in ended), ended  # bound + log-time slack
    assert rejoined < 10
    assert summary["fragments_duplicate"] == 0
    # The frozen side is named: the learner, not "every worker is stalled".
    text = log.read_text()
    assert "the learner process did not run for" in text and "every worker is stalled" not in text
    assert summary["learner_frozen_seconds"] >= 7 and summary["stalled_seconds"] == 0
    wait_for(lambda: processes_mentioning(str(out)) == [], 30, "children to exit")


@pytest.mark.slow
def test_a_worker_that_keeps_dying_does_not_end_a_run_that_makes_progress(
        measured, tmp_path) -> None:
    # Each worker process dies every ~4,000 of its steps (1,000 per env): 10+ deaths per
    # worker in a run of 60k steps, far past any budget per run, and the run finishes.
    out = tmp_path / "leaky"
    proc, log = start(out, "--env", "tests.reliability.envs:DiesEvery", "--workers", "2",
                      "--envs-per-worker", "4", "--fragment-length", "32", "--total-steps",
                      "60000", env={"HETRL_TEST_DIE_AFTER": "1000"})
    try:
        assert proc.wait(600) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    measured(f"leaky workers: {summary['worker_restarts']} restarts, "
          f"{summary['global_step']} steps, outcome {summary['outcome']}")
    assert summary["outcome"] == "finished" and summary["global_step"] >= 60_000
    assert summary["worker_restarts"] >= 8
    assert "MemoryError: simulator leaked" in log.read_text()  # each death says why


@pytest.mark.slow
def test_a_worker_that_cannot_deliver_ends_the_run_naming_the_cause(tmp_path) -> None:
    out = tmp_path / "doomed"
    proc, log = start(out, "--env", "tests.reliability.envs:DiesEvery", "--workers", "1",
                      "--envs-per-worker", "2", "--total-steps", "60000",
                      env={"HETRL_TEST_DIE_AT_START": "1"})
    try:
        assert proc.wait(300) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert "worker-0 died 5 times in a row before it delivered any experience" in output
    assert "MemoryError: simulator leaked" in output
    assert output.rstrip().splitlines()[-1].startswith("hetrl: to continue this run")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"].startswith("failed: worker-0 died 5 times")
    assert summary["verdict"] == "failed"
    wait_for(lambda: processes_mentioning(str(out)) == [], 30, "children to exit")


@pytest.mark.slow
def test_a_slow_simulator_is_slow_not_stalled_and_stops_at_once(measured, tmp_path) -> None:
    """13 ms a step, 8 envs x 64 steps: each fragment takes ~7 s, longer than the 5 s a
    stop waits and close to the old 10 s stall alarm. Slow is not hung: no stall is
    reported, a stop ends the fragment in progress at once (cancelled, not awaited), and
    the verdict names the envs' step cost."""
    out = tmp_path / "slow"
    proc, log = start(out, "--env", "tests.fixtures.envs:SlowStep", "--workers", "2",
                      "--envs-per-worker", "8", "--fragment-length", "64", "--total-steps",
                      "100000000", env={"HETRL_TEST_STEP_SECONDS": "0.013"})
    try:
        wait_for(lambda: step(out) >= 3 * 1024, 180, "three fragments per worker's worth")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        stopped = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    summary = json.loads((out / "summary.json").read_text())
    measured(f"slow env: stopped {stopped:.1f} s after SIGTERM; verdict {summary['verdict_text']}")
    assert "stalled" not in output and summary["stalled_seconds"] == 0, output[-3000:]
    assert summary["workers_not_stopped"] == [] and "did not end their streams" not in output
    assert stopped < 10
    assert summary["verdict"] == "experience-bound"
    assert "ms of a worker's time per env step" in summary["verdict_text"]
    wait_for(lambda: processes_mentioning(str(out)) == [], 30, "children to exit")


@pytest.mark.slow
def test_a_slow_start_up_is_progress_not_a_timeout(tmp_path) -> None:
    """4 envs of 3 s resets: 12 s of start-up, longer than every time limit given here
    (--step-timeout 5, --connect-timeout 5, --startup-timeout 10). The worker listens
    first and says what it is doing; each reset restarts the clocks; the run trains."""
    out = tmp_path / "slowstart"
    proc, log = start(out, "--env", "tests.reliability.envs:SlowReset", "--workers", "1",
                      "--envs-per-worker", "4", "--vector-mode", "sync", "--total-steps",
                      "4000", "--step-timeout", "5", "--connect-timeout", "5",
                      "--startup-timeout", "10", env={"HETRL_TEST_RESET_SECONDS": "3"})
    try:
        assert proc.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert re.search(r"is starting: resetting envs, \d of 4 done", output), output[-3000:]
    worker_log = (out / "launch" / "logs" / "worker-0.log").read_text()
    assert "worker 0 ready after" in worker_log
    assert count(log, "restarting") == 0
