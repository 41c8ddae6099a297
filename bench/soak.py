"""Soak: a long `hetrl local` job under faults, against a fault-free run of the same seed.

The job trains `bench.envs:FaultyCartPole` (CartPole-v1 whose steps raise 1% of the
time, and one of whose resets takes 30 s once) for --minutes of wall time, while a fault
injector kills a random worker (SIGKILL) every ~60 s and freezes one (SIGSTOP) for 30 s
every ~5 min; then it stops the job (SIGTERM, as a scheduler does). A fault-free run of
the same seed trains on plain CartPole-v1 for the same number of env steps. The record
says: the job finished and stopped cleanly, worker restarts, steps lost (fragments in
flight with a killed worker, env faults, aborted episodes), the time from each kill to
that worker's next stream (its recovery), the final mean return of both runs and both
learning curves, and the load the machine carried. Targets: every recovery under 10 s,
the final return within the fault-free run's (CartPole: both at 500).
Run: `python -m bench.soak [--minutes 30] [--quick]`; record
bench/results/summary_soak.json, curves bench/results/soak.png.
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
    quick: bool = False
    """3 minutes, a kill every 30 s, a freeze at 90 s."""


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
        next_kill = start + self.s.kill_every
        next_freeze = start + self.s.freeze_every / 2
        while not self.stop_event.wait(0.5):
            now = time.monotonic()
            workers = _workers(self.out)
            if not workers:
                continue
            if now >= next_kill:
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


def _stream_times(log: str) -> list[tuple[float, int]]:
    """(unix time, worker id) of every 'streaming from worker' line of the learner."""
    out = []
    for match in re.finditer(r"^(\S+ \S+) hetrl\.learner INFO streaming from worker (\d+)",
                             log, re.M):
        stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append((stamp, int(match.group(2))))
    return out


def _curve(out: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["global_step"], r["wall_seconds"], r["charts/mean_return_100"]) for r in rows
            if "charts/mean_return_100" in r]


def faulty_job(s: Settings) -> dict[str, Any]:
    out = common.RESULTS / "runs" / "soak-faulty"
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    flag = out.parent / "soak-slow-reset.flag"
    flag.unlink(missing_ok=True)
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
    busy_end = psutil.cpu_times()
    text = log_path.read_text()
    summary = json.loads((out / "summary.json").read_text())
    streams = _stream_times(text)
    recoveries = []
    for event in injector.events:
        if event["kind"] != "kill":
            continue
        after = [t for t, w in streams if w == event["worker"] and t > event["at"]]
        recoveries.append(round(after[0] - event["at"], 2) if after else None)
    idle = (busy_end.idle - busy_start.idle) / psutil.cpu_count()
    wall = time.time() - started
    return {
        "exit_code": code, "ended_by_itself": ended_early, "outcome": summary["outcome"],
        "global_step": summary["global_step"], "wall_seconds": summary["wall_seconds"],
        "final_mean_return_100": summary["mean_return_100"], "best": summary.get("best"),
        "worker_restarts": summary.get("worker_restarts"),
        "kills": sum(e["kind"] == "kill" for e in injector.events),
        "freezes": sum(e["kind"] == "freeze" for e in injector.events),
        "slow_reset_happened": flag.exists(),
        "recovery_seconds": recoveries,
        "fragments_lost_in_flight": summary.get("fragments_lost_in_flight"),
        **{key: summary.get(key) for key in ("env_faults", "episodes_aborted",
                                             "env_steps_lost", "reconnects", "sequence_gaps",
                                             "workers_lost",
                                             "stalled_seconds")},
        "machine_busy_cores": round(psutil.cpu_count() - idle / max(wall, 1e-9), 2),
        "curve": _curve(out), "events": injector.events,
    }


def fault_free(steps: int) -> dict[str, Any]:
    from hetrl.launch import run_local

    out = common.RESULTS / "runs" / "soak-clean"
    shutil.rmtree(out, ignore_errors=True)
    result = run_local(env="CartPole-v1", workers=2, total_steps=steps, seed=1, out=str(out),
                       progress=False, report=False)
    return {"exit_code": result.exit_code, "global_step": result.summary["global_step"],
            "final_mean_return_100": result.summary["mean_return_100"],
            "wall_seconds": result.summary["wall_seconds"], "curve": _curve(out)}


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, minutes=3.0, kill_every=30.0, freeze_every=180.0)
    print(f"faulty job: {s.minutes:.0f} min ...", flush=True)
    faulty = faulty_job(s)
    print(f"fault-free run: {faulty['global_step']:,} steps ...", flush=True)
    clean = fault_free(faulty["global_step"])
    recovered = [r for r in faulty["recovery_seconds"] if r is not None]
    ok = (faulty["exit_code"] == 0 and not faulty["ended_by_itself"]
          and len(recovered) == len(faulty["recovery_seconds"])
          and all(r < RECOVERY_TARGET for r in recovered)
          and faulty["final_mean_return_100"] >= clean["final_mean_return_100"] - 25)
    rows = [
        ["wall minutes", f"{s.minutes:.0f}", f"{clean['wall_seconds'] / 60:.1f}"],
        ["env steps", f"{faulty['global_step']:,}", f"{clean['global_step']:,}"],
        ["final mean return(100)", f"{faulty['final_mean_return_100']:.1f}",
         f"{clean['final_mean_return_100']:.1f}"],
        ["worker kills / freezes / slow reset", f"{faulty['kills']} / {faulty['freezes']} / "
         f"{'yes' if faulty['slow_reset_happened'] else 'no'}", "-"],
        ["worker restarts", faulty["worker_restarts"], "-"],
        ["recovery after a kill, s (max)", f"{max(recovered, default=0):.1f}", "-"],
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
    name = "soak" if s.quick else "summary_soak"
    common.write_json(name, s, {"faulty": faulty, "fault_free": clean, "pass": ok})

    def draw(plt):
        for label, run in (("faults", faulty), ("fault-free", clean)):
            steps = [c[0] for c in run["curve"]]
            plt.plot(steps, [c[2] for c in run["curve"]], label=label)
        plt.xlabel("env steps")
        plt.ylabel("mean return (last 100 episodes)")
        plt.title("Soak: CartPole-v1 under faults, seed 1")
        plt.legend()

    common.plot("soak", draw, enabled=not s.quick)
    return {"pass": ok}


if __name__ == "__main__":
    main()
