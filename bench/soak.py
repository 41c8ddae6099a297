"""Soak: a long `hetrl local` job under faults, against a fault-free run of the same seed.

The job trains `bench.envs:FaultyCartPole` (CartPole-v1 whose steps raise 1% of the
time, and one of whose resets takes 30 s once) for --minutes of wall time, while a fault
injector kills a random worker (SIGKILL) every ~60 s and freezes one (SIGSTOP) for 30 s
every ~5 min; then it stops the job (SIGTERM, as a scheduler does). A fault-free run of
the same seed trains on plain CartPole-v1 for the same number of env steps; both final
policies then play 20 episodes without faults (the faulty run's training mean return is
biased low: it reports only the episodes no fault aborted, mostly short ones). The record
says: the job finished and stopped cleanly, worker restarts, steps lost (fragments in
flight with a killed worker, env faults, aborted episodes), the time from each kill to
that worker's next stream (its recovery), the final mean return of both runs and both
learning curves, and the load the machine carried. Targets: every recovery under 10 s (no kill
in the last 30 s), the final policy's return within 25 of the fault-free run's
(CartPole: both at 500).
With --emulate the job runs as `hetrl emulate` (2 env hosts x 1 worker) and the injector
SIGKILLs an env host (its workers die with it) every ~60 s and starts it again on its
tree 5 s later, as a replaced spot instance; recovery is counted from the replacement's
start to its worker's next stream.
Run: `python -m bench.soak [--minutes 30] [--quick] [--emulate]`; record
bench/results/summary_soak.json (summary_soak_emulate.json; --tag T: summary_soak-T.json), curves
bench/results/soak.png (soak_emulate.png).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import tyro

from bench import common
from bench.envs import SLOW_RESET_FLAG, STEP_FAULT_RATE

RECOVERY_TARGET = 10.0
QUIET_TAIL = 30.0
"""No kill in the job's last seconds: a worker killed as the job stops cannot recover."""
PLAYED_EPISODES = 20


@dataclasses.dataclass
class Settings:
    """A long job under worker kills, freezes, env faults and a slow reset."""

    minutes: float = 30.0
    """Wall minutes of the faulty job."""
    kill_every: float = 60.0
    """Mean seconds between worker kills."""
    freeze_every: float = 300.0
    """Seconds between worker freezes (30 s each)."""
    workers: int = 2
    """Workers of the job."""
    fault_free_steps: int = 0
    """Env steps of the fault-free run; 0: as many as the faulty job made. CartPole's
    policy is settled long before 30 minutes' steps, so a shorter run compares the same
    final policy in a fraction of the time."""
    quick: bool = False
    """3 minutes, a kill every 30 s, a freeze at 90 s."""
    tag: str = ""
    """Appended to the record's name (summary_soak-TAG.json), so that tries of the same
    benchmark sit side by side instead of replacing each other."""
    emulate: bool = False
    """The job as `hetrl emulate` (2 env hosts x 1 worker): instead of worker kills and
    freezes, an env host is SIGKILLed (with its workers) every ~kill_every s and started
    again on its tree 5 s later, as a replaced spot instance is."""

REPLACE_DELAY = 5.0
"""Seconds between an env host's kill and its replacement's start (emulate)."""


def _workers(out: Path) -> dict[int, int]:
    """worker index -> pid of the job's worker processes now."""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        match = re.search(re.escape(str(out / "launch")) + r"/worker-(\d+)\.json", cmd)
        if match:
            found[int(match.group(1))] = proc.info["pid"]
    return found


class Injector(threading.Thread):
    """Kills a worker every ~kill_every s, freezes one for 30 s every freeze_every s."""

    def __init__(self, out: Path, s: Settings, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="fault-injector")
        self.out, self.s, self.stop_event = out, s, stop
        self.events: list[dict[str, Any]] = []
        self.rng = random.Random(1)

    def run(self) -> None:
        start = time.monotonic()
        last_kill = start + self.s.minutes * 60 - QUIET_TAIL
        next_kill = start + self.s.kill_every
        next_freeze = start + self.s.freeze_every / 2
        while not self.stop_event.wait(0.5):
            now = time.monotonic()
            workers = _workers(self.out)
            if not workers:
                continue
            if last_kill > now >= next_kill:
                index = self.rng.choice(sorted(workers))
                os.kill(workers[index], signal.SIGKILL)
                self.events.append({"kind": "kill", "worker": index, "at": time.time()})
                next_kill = now + self.rng.uniform(0.5, 1.5) * self.s.kill_every
            if now >= next_freeze:
                index = self.rng.choice(sorted(workers))
                pid = workers[index]
                os.kill(pid, signal.SIGSTOP)
                self.events.append({"kind": "freeze", "worker": index, "at": time.time()})
                if self.stop_event.wait(30.0):
                    os.kill(pid, signal.SIGCONT)
                    return
                os.kill(pid, signal.SIGCONT)
                next_freeze = time.monotonic() + self.s.freeze_every


def _stream_times(log: str) -> list[tuple[float, int, str]]:
    """(unix time, worker id, worker host address) of every 'streaming from worker' line
    of the learner."""
    out = []
    for match in re.finditer(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) hetrl\.learner INFO "
                             r"streaming from worker (\d+) at ([\d.]+):", log):
        stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append((stamp, int(match.group(2)), match.group(3)))
    return out


def _curve(metrics: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [(r["global_step"], r["wall_seconds"], r["charts/mean_return_100"]) for r in rows
            if "charts/mean_return_100" in r]


_LOSSES = ("fragments_lost_in_flight", "env_faults", "episodes_aborted", "env_steps_lost",
           "reconnects", "sequence_gaps", "workers_lost", "stalled_seconds")
"""What a faulty job's summary says it lost or absorbed."""


def _fresh_run(name: str) -> tuple[Path, Path]:
    """An empty run folder bench/results/runs/<name> and the slow-reset flag's path
    beside it (removed, so the one slow reset happens again)."""
    out = common.RESULTS / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    flag = out.parent / f"{name}-slow-reset.flag"
    flag.unlink(missing_ok=True)
    return out, flag


def _busy_cores(busy_start, started: float) -> float:
    """Cores the machine kept busy since `busy_start` (psutil.cpu_times) at `started`."""
    idle = (psutil.cpu_times().idle - busy_start.idle) / psutil.cpu_count()
    return round(psutil.cpu_count() - idle / max(time.time() - started, 1e-9), 2)


def faulty_job(s: Settings) -> dict[str, Any]:
    out, flag = _fresh_run("soak-faulty")
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{STEP_FAULT_RATE: "0.01",
                                                   SLOW_RESET_FLAG: str(flag)})
    log_path = out.parent / "soak-faulty.log"
    busy_start = psutil.cpu_times()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hetrl.launch", "local", "--env",
             "bench.envs:FaultyCartPole", "--workers", str(s.workers), "--total-steps",
             "1000000000", "--seed", "1", "--out", str(out), "--no-progress"],
            cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    stop = threading.Event()
    injector = Injector(out, s, stop)
    injector.start()
    started = time.time()
    deadline = time.monotonic() + s.minutes * 60
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1.0)
    stop.set()
    injector.join(40)
    ended_early = proc.poll() is not None
    if not ended_early:
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
    busy_cores = _busy_cores(busy_start, started)
    text = log_path.read_text()
    summary = json.loads((out / "summary.json").read_text())
    streams = _stream_times(text)
    recoveries = []
    for event in injector.events:
        if event["kind"] != "kill":
            continue
        after = [t for t, w, _ in streams if w == event["worker"] and t > event["at"]]
        recoveries.append(round(after[0] - event["at"], 2) if after else None)
    return {
        "exit_code": code, "ended_by_itself": ended_early, "outcome": summary["outcome"],
        "global_step": summary["global_step"], "wall_seconds": summary["wall_seconds"],
        "final_mean_return_100": summary["mean_return_100"], "best": summary.get("best"),
        "worker_restarts": summary.get("worker_restarts"),
        "kills": sum(e["kind"] == "kill" for e in injector.events),
        "freezes": sum(e["kind"] == "freeze" for e in injector.events),
        "slow_reset_happened": flag.exists(),
        "recovery_seconds": recoveries,
        **{key: summary.get(key) for key in _LOSSES},
        "machine_busy_cores": busy_cores,
        "curve": _curve(out / "metrics.jsonl"), "events": injector.events,
        "played_return": played(out),
    }


def emulated_job(s: Settings) -> dict[str, Any]:
    """The faulty job on an emulated cluster whose env hosts are killed and replaced."""
    from hetrl.launch.emulate import EmulateSettings, collect_result, prepare_hosts, start_host
    from hetrl.launch.processes import stop_all

    out, flag = _fresh_run("soak-emulated")
    faults = {STEP_FAULT_RATE: "0.01", SLOW_RESET_FLAG: str(flag), "PYTHONUNBUFFERED": "1"}
    cfg = EmulateSettings(env="bench.envs:FaultyCartPole", env_hosts=2, workers_per_env_host=1,
                          total_steps=1_000_000_000, seed=1, out=str(out), progress=False)
    log_path = out.parent / "soak-emulated.log"
    log_path.unlink(missing_ok=True)
    cluster = prepare_hosts(cfg, learner_log=log_path)
    rng = random.Random(1)
    events: list[dict[str, Any]] = []
    busy_start = psutil.cpu_times()
    started = time.time()
    try:
        for host in [*cluster.env_hosts, cluster.learner]:
            start_host(cluster, host, environment=faults)
        learner = cluster.hosts[cluster.learner]
        deadline = time.monotonic() + s.minutes * 60
        next_kill = time.monotonic() + s.kill_every
        while time.monotonic() < deadline and learner.exit_code() is None:
            time.sleep(0.5)
            if not deadline - QUIET_TAIL > time.monotonic() >= next_kill:
                continue
            host = rng.choice(cluster.env_hosts)
            cluster.hosts[host].process.kill()  # its workers follow (PR_SET_PDEATHSIG)
            cluster.hosts[host].process.wait()
            events.append({"kind": "kill", "host": host, "at": time.time()})
            time.sleep(REPLACE_DELAY)
            start_host(cluster, host, environment=faults)
            events.append({"kind": "restart", "host": host, "at": time.time()})
            next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * s.kill_every
        ended_early = learner.exit_code() is not None
        if not ended_early:
            learner.process.send_signal(signal.SIGTERM)  # a job stop
        deadline = time.monotonic() + cfg.stop_budget + 30
        while (time.monotonic() < deadline
               and any(c.exit_code() is None for c in cluster.hosts.values())):
            time.sleep(0.2)
    finally:
        stop_all(list(cluster.hosts.values()), 5.0)
    busy_cores = _busy_cores(busy_start, started)
    result = collect_result(cluster)
    summary = result.summary
    streams = _stream_times(log_path.read_text())
    recoveries = []
    for event in events:
        if event["kind"] != "restart":
            continue
        address = f"127.0.0.{event['host'].split('-')[1]}"
        after = [t for t, _, a in streams if a == address and t > event["at"]]
        recoveries.append(round(after[0] - event["at"], 2) if after else None)
    return {
        "exit_code": result.exit_code, "host_exit_codes": result.exit_codes,
        "ended_by_itself": ended_early, "outcome": summary.get("outcome"),
        "global_step": summary.get("global_step", 0),
        "wall_seconds": summary.get("wall_seconds"),
        "final_mean_return_100": summary.get("mean_return_100", 0.0),
        "best": summary.get("best"), "worker_restarts": summary.get("worker_restarts"),
        "kills": sum(e["kind"] == "kill" for e in events), "freezes": 0,
        "slow_reset_happened": flag.exists(),
        "recovery_seconds": recoveries,
        **{key: summary.get(key) for key in _LOSSES},
        "machine_busy_cores": busy_cores,
        "curve": _curve(out / "hosts" / cluster.learner / "model" / "metrics.jsonl"),
        "events": events,
        "played_return": played(out / "hosts" / cluster.learner / "model"),
    }


def played(model_dir: Path) -> float:
    """Mean return of the run's final policy over PLAYED_EPISODES episodes of the env
    without faults (this process does not set the fault variables). The training
    mean(100) of a faulty run is no measure of its policy: an episode a fault aborts is
    not reported, and a 500-step one survives 1% faults per step 0.7% of the time, so
    the episodes it reports are mostly short ones."""
    from hetrl.rollout.evaluate import evaluate, load_policy

    return evaluate(load_policy(model_dir, "final"), episodes=PLAYED_EPISODES,
                    seed=1000).mean_return


def fault_free(steps: int) -> dict[str, Any]:
    from hetrl.launch import run_local

    out = common.RESULTS / "runs" / "soak-clean"
    shutil.rmtree(out, ignore_errors=True)
    result = run_local(env="CartPole-v1", workers=2, total_steps=steps, seed=1, out=str(out),
                       progress=False, report=False)
    return {"exit_code": result.exit_code, "global_step": result.summary["global_step"],
            "final_mean_return_100": result.summary["mean_return_100"],
            "wall_seconds": result.summary["wall_seconds"],
            "curve": _curve(out / "metrics.jsonl"), "played_return": played(out)}


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, minutes=3.0, kill_every=30.0, freeze_every=180.0)
    print(f"faulty {'emulated ' if s.emulate else ''}job: {s.minutes:.0f} min ...",
          flush=True)
    faulty = emulated_job(s) if s.emulate else faulty_job(s)
    print(f"fault-free run: {faulty['global_step']:,} steps ...", flush=True)
    clean = fault_free(s.fault_free_steps or faulty["global_step"])
    recovered = [r for r in faulty["recovery_seconds"] if r is not None]
    ok = (faulty["exit_code"] == 0 and not faulty["ended_by_itself"]
          and len(recovered) == len(faulty["recovery_seconds"])
          and all(r < RECOVERY_TARGET for r in recovered)
          and faulty["played_return"] >= clean["played_return"] - 25)
    rows = [
        ["wall minutes", f"{s.minutes:.0f}", f"{clean['wall_seconds'] / 60:.1f}"],
        ["env steps", f"{faulty['global_step']:,}", f"{clean['global_step']:,}"],
        [f"final policy's return, {PLAYED_EPISODES} episodes without faults",
         f"{faulty['played_return']:.1f}", f"{clean['played_return']:.1f}"],
        ["training mean return(100) at the end (faults bias it low)",
         f"{faulty['final_mean_return_100']:.1f}", f"{clean['final_mean_return_100']:.1f}"],
        [f"{'env host' if s.emulate else 'worker'} kills / freezes / slow reset",
         f"{faulty['kills']} / {faulty['freezes']} / "
         f"{'yes' if faulty['slow_reset_happened'] else 'no'}", "-"],
        ["worker restarts", faulty["worker_restarts"], "-"],
        [("recovery after a host's replacement starts" if s.emulate else
          "recovery after a kill") + ", s (max)", f"{max(recovered, default=0):.1f}", "-"],
        ["reconnects / sequence gaps (fragments lost with a killed worker)",
         f"{faulty['reconnects']} / {faulty['sequence_gaps']}", "-"],
        ["env faults / aborted episodes", f"{faulty['env_faults']} / "
         f"{faulty['episodes_aborted']}", "-"],
        ["exit code, outcome", f"{faulty['exit_code']}, {faulty['outcome']}",
         f"{clean['exit_code']}"],
        ["machine busy cores", faulty["machine_busy_cores"], "-"],
    ]
    common.print_table(f"Soak: faulty job vs fault-free run of the same seed "
                       f"({'PASS' if ok else 'FAIL'})", ["", "faulty", "fault-free"], rows)
    name = (("soak" if s.quick else "summary_soak") + ("_emulate" if s.emulate else "")
            + (f"-{s.tag}" if s.tag else ""))
    common.write_json(name, s, {"faulty": faulty, "fault_free": clean, "pass": ok})

    def draw(plt):
        for label, run in (("faults", faulty), ("fault-free", clean)):
            steps = [c[0] for c in run["curve"]]
            plt.plot(steps, [c[2] for c in run["curve"]], label=label)
        plt.xlabel("env steps")
        plt.ylabel("mean return (last 100 episodes)")
        plt.title(f"Soak{' (emulated cluster)' if s.emulate else ''}: CartPole-v1 under "
                  "faults, seed 1")
        plt.legend()

    common.plot(("soak_emulate" if s.emulate else "soak") + (f"-{s.tag}" if s.tag else ""),
                draw, enabled=not s.quick)
    return {"pass": ok}


if __name__ == "__main__":
    main()
