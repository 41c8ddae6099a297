"""Benchmark 5, time to solve: CartPole-v1 to a mean return (last 100 episodes) >= 475.

Runs `launch.run_local` (the same code as `hetrl local`: worker processes, a learner
process, gRPC on loopback) with default settings for several seeds, nothing pinned,
while a thread watches the run's metrics.jsonl. A seed counts as solved when the mean
reaches 475 and is still >= 475 at the end of the run. Wall seconds to solve are counted
from the call that starts the run (process start-up, imports and env creation
included) to the moment the first record with charts/mean_return_100 >= 475 is
written; the learner's own clock at that record is reported too. The run continues to
--total-steps, as `make train` would. Run: `python -m bench.solve [--quick]`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path

import tyro

from bench import common
from hetrl.launch import run_local

THRESHOLD = 475.0


@dataclasses.dataclass
class Settings:
    """Time to solve CartPole-v1 with hetrl's default settings."""

    seeds: tuple[int, ...] = (1, 2, 3)
    """Seeds to run (the median over them is the figure)."""
    env: str = "CartPole-v1"
    """Env to solve."""
    total_steps: int = 300_000
    """Env steps per run (hetrl's default)."""
    workers: int = 2
    """Worker processes (hetrl's default)."""
    envs_per_worker: int = 8
    """Envs per worker (hetrl's default)."""
    target_seconds: float = 60.0
    """Pass if the median wall seconds to solve is under this."""
    quick: bool = False
    """One seed, 60k steps (a smoke run; it usually does not solve)."""


class Watcher(threading.Thread):
    """Polls metrics.jsonl and notes when the threshold is first reached."""

    def __init__(self, path: Path, start: float) -> None:
        super().__init__(daemon=True, name="solve-watcher")
        self.path, self.start_time = path, start
        self.done = threading.Event()
        self.solved: dict | None = None
        self._offset = 0

    def _poll(self) -> None:
        if self.solved is not None or not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self._offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self._offset += len(line.encode())
                record = json.loads(line)
                if record.get("charts/mean_return_100", -1e9) >= THRESHOLD:
                    self.solved = {"wall_s": time.perf_counter() - self.start_time,
                                   "learner_wall_s": record["wall_seconds"],
                                   "global_step": record["global_step"]}
                    return

    def run(self) -> None:
        while not self.done.wait(0.05):
            self._poll()
        self._poll()


def run_seed(seed: int, s: Settings) -> dict:
    out = common.RESULTS / "runs" / f"solve-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    watcher = Watcher(out / "metrics.jsonl", start)
    watcher.start()
    # A metrics row per update (not hetrl's 2 s rate), so the watcher sees the moment.
    result = run_local(env=s.env, workers=s.workers, envs_per_worker=s.envs_per_worker,
                       total_steps=s.total_steps, seed=seed, out=str(out), progress=False,
                       metrics_every=0)
    total = time.perf_counter() - start
    watcher.done.set()
    watcher.join(5)
    return {"seed": seed, "ok": result.ok, "solved": watcher.solved, "command_wall_s": total,
            "final_mean_return_100": result.summary.get("mean_return_100"),
            "global_step": result.summary.get("global_step"),
            "learner_wait_seconds": result.summary.get("learner_wait_seconds"),
            "learner_train_seconds": result.summary.get("learner_train_seconds")}


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, seeds=(1,), total_steps=60_000)
    runs = []
    for seed in s.seeds:
        print(f"seed {seed} ...", flush=True)
        runs.append(run_seed(seed, s))
    # An unsolved seed counts as the whole command's wall time, so it drags the median up.
    walls = [r["solved"]["wall_s"] if r["solved"] else float("inf") for r in runs]
    finite = [w for w in walls if w != float("inf")]
    median = sorted(walls)[len(walls) // 2] if walls else None
    # Solved counts only if it holds: the mean of the last 100 is >= 475 at the end too.
    held = sum(r["solved"] is not None and (r["final_mean_return_100"] or 0) >= THRESHOLD
               for r in runs)
    summary = {
        "solve_wall_s": common.summarize(finite),
        "median_over_all_seeds_s": median,
        "solved_seeds": len(finite), "seeds": len(runs),
        "still_solved_at_the_end": held,
        "target_seconds": s.target_seconds,
        "pass": median is not None and median < s.target_seconds and held == len(runs),
        "steps_to_solve": common.summarize(
            [r["solved"]["global_step"] for r in runs if r["solved"]]),
        "command_wall_s": common.summarize([r["command_wall_s"] for r in runs]),
    }
    rows = [[r["seed"], f"{r['solved']['global_step']:,}" if r["solved"] else "not solved",
             f"{r['solved']['wall_s']:.1f}" if r["solved"] else "-",
             f"{r['solved']['learner_wall_s']:.1f}" if r["solved"] else "-",
             r["final_mean_return_100"], f"{r['command_wall_s']:.1f}"] for r in runs]
    rows.append(["median", common.fmt(summary["steps_to_solve"]),
                 common.fmt(summary["solve_wall_s"], ".1f"), "", "",
                 common.fmt(summary["command_wall_s"], ".1f")])
    common.print_table(
        f"Time to solve {s.env} (mean return(100) >= {THRESHOLD:.0f}), hetrl local defaults "
        f"({s.workers} workers x {s.envs_per_worker} envs, {s.total_steps:,} steps); target "
        f"median < {s.target_seconds:.0f} s and solved at the end: "
        f"{'PASS' if summary['pass'] else 'FAIL'}",
        ["seed", "steps to solve", "wall s to solve", "learner clock s", "final mean(100)",
         "whole command s"], rows)
    common.write_json("solve" if s.quick else "summary_solve", s,
                      {"runs": runs, "summary": summary})
    return summary


if __name__ == "__main__":
    main()
