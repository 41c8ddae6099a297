"""Where a `hetrl local` command's wall time goes: start-up, training, stop, report.

Runs the CLI as a user does (`python -m hetrl.launch local ...` in a fresh process, the
`make train` command by default), several times, and splits each run's wall time with
the clocks the run records: the process start (psutil), each worker's ready file (it
listens), the learner opening its books (connected, about to train), its first update,
the end of training, the summary's stop and report times. The headline is the whole
command's wall time over its training time (target: at most 1.5 on a quiet machine).
Run: `python -m bench.startup [--quick]`; record bench/results/summary_startup.json.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from typing import Any

import psutil
import tyro

from bench import common

TARGET_RATIO = 1.5


@dataclasses.dataclass
class Settings:
    """Start-up, training, stop and report time of `hetrl local`."""

    total_steps: int = 300_000
    """Env steps per run (`make train`'s)."""
    repeats: int = 3
    """Runs (the median is the figure)."""
    quick: bool = False
    """One run of 20k steps (a smoke run)."""


def run_once(s: Settings, index: int) -> dict[str, Any]:
    out = common.RESULTS / "runs" / f"startup-{index}"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "hetrl.launch", "local", "--env", "CartPole-v1",
               "--workers", "2", "--envs-per-worker", "8", "--total-steps",
               str(s.total_steps), "--seed", "1", "--out", str(out)]
    before = time.time()
    proc = subprocess.Popen(command, cwd=common.ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    started = psutil.Process(proc.pid).create_time()
    output, _ = proc.communicate(timeout=1800)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"hetrl local failed:\n{output[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    timing = summary["timing"]
    ready = max(p.stat().st_mtime for p in (out / "launch").glob("worker-*.ready"))
    command_s = ended - started
    training = timing["training_seconds"]
    return {
        "command_seconds": round(command_s, 2),
        "spawn_seconds": round(started - before, 3),
        "workers_listening_seconds": round(ready - started, 2),
        "learner_connected_seconds": round(summary["opened_unix"] - started, 2),
        "first_update_seconds": round(summary["first_update_unix"] - started, 2),
        "startup_seconds": timing["startup_seconds"],
        "training_seconds": training,
        "stop_seconds": timing["stop_seconds"],
        "report_seconds": timing.get("report_seconds"),
        "after_report_seconds": round(ended - started - timing["command_seconds"]
                                      - (timing.get("report_seconds") or 0.0), 2),
        "command_over_training": round(command_s / training, 3),
        "env_steps": summary["global_step"],
        "final_mean_return_100": summary["mean_return_100"],
        "loadavg_1min_end": psutil.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, total_steps=20_000, repeats=1)
    runs = []
    for i in range(s.repeats):
        print(f"run {i + 1}/{s.repeats} ...", flush=True)
        runs.append(run_once(s, i))
    keys = ("workers_listening_seconds", "learner_connected_seconds", "first_update_seconds",
            "training_seconds", "stop_seconds", "report_seconds", "command_seconds",
            "command_over_training")
    summary = {k: common.summarize([r[k] for r in runs if r[k] is not None]) for k in keys}
    ratio = summary["command_over_training"]["median"]
    summary["target_ratio"] = TARGET_RATIO
    summary["pass"] = ratio is not None and ratio <= TARGET_RATIO
    common.print_table(
        f"hetrl local CartPole-v1, 2 workers x 8 envs, {s.total_steps:,} steps, "
        f"{s.repeats} runs: seconds from the process start; command / training "
        f"{ratio} (target <= {TARGET_RATIO}: {'PASS' if summary['pass'] else 'FAIL'})",
        ["what", "median [min-max]"],
        [[k.removesuffix("_seconds").replace("_", " "), common.fmt(summary[k], ".2f")]
         for k in keys])
    common.write_json("startup" if s.quick else "summary_startup", s,
                      {"summary": summary, "runs": runs})
    return summary


if __name__ == "__main__":
    main()
