"""Memory: CartPole-v1 with its velocities hidden (CartPole-NoVel, bench.envs), learned
with --recurrent lstm and with the feed-forward default, seeds 1-3.

Each run is `hetrl local` (2 workers x 8 envs, the same code as the CLI) for
--total-steps; a thread-free read of the run's metrics.jsonl afterwards gives the first
step at which mean(100) reached --threshold and the final mean(100). The target (issue
28): the LSTM reaches 400 within 1M steps for every seed, where the feed-forward policy
stays far below. Run: `python -m bench.memory [--quick]`; record
bench/results/summary_memory.json.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import tyro

from bench import common
from hetrl.launch import report, run_local
from hetrl.rollout.errors import ConfigError

ENV = "bench.envs:CartPoleNoVel"


@dataclasses.dataclass
class Settings:
    """CartPole-NoVel with and without a memory."""

    seeds: tuple[int, ...] = (1, 2, 3)
    total_steps: int = 1_000_000
    threshold: float = 400.0
    policies: tuple[str, ...] = ("lstm", "none")
    """--recurrent of each run ("none": the feed-forward default)."""
    rnn_size: int = 128
    quick: bool = False
    """One seed, 100k steps (a smoke run)."""


def first_reaching(run_dir: Path, threshold: float) -> int | None:
    """The first step at which the run's mean(100) reached `threshold`, judged as `hetrl
    report` judges it (once 100 episodes have ended: MiniGrid's first update read 0.80
    over 2), or None."""
    try:
        curve = report.judged(report.return_curve(report.Run(run_dir)))
    except ConfigError:  # no episode has ended
        return None
    point = report.first_reaching(curve, threshold)
    return point.step if point else None


def run(policy: str, seed: int, s: Settings) -> dict:
    out = common.RESULTS / "runs" / f"memory-{policy}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    result = run_local(env=ENV, recurrent=policy, rnn_size=s.rnn_size, seed=seed,
                       total_steps=s.total_steps, out=str(out), progress=False, report=False)
    return {"policy": policy, "seed": seed, "ok": result.ok,
            "final_mean_return_100": result.summary.get("mean_return_100"),
            "best_mean_return": (result.summary.get("best") or {}).get("mean_return"),
            "first_step_at_threshold": first_reaching(out, s.threshold),
            "wall_s": round(time.perf_counter() - start, 1)}


def record_name(s: Settings) -> str:
    """summary_memory for the default runs; another set of policies or step budget names
    its own record, so a partial run never overwrites the whole one."""
    shipped = Settings()
    if (s.policies, s.total_steps) == (shipped.policies, shipped.total_steps) or s.quick:
        return "summary_memory"
    return f"summary_memory-{'-'.join(s.policies)}-{s.total_steps}"


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, seeds=(1,), total_steps=100_000)
    runs = []
    for policy in s.policies:
        for seed in s.seeds:
            print(f"{policy} seed {seed} ...", flush=True)
            runs.append(run(policy, seed, s))
    lstm = [r for r in runs if r["policy"] != "none"]
    plain = [r for r in runs if r["policy"] == "none"]
    summary = {
        "recurrent_reached_threshold": sum(r["first_step_at_threshold"] is not None
                                           for r in lstm),
        "feed_forward_reached_threshold": sum(r["first_step_at_threshold"] is not None
                                              for r in plain),
        "seeds": len(s.seeds),
        # over the runs made: a feed-forward-only run (--policies none) checks that half
        "pass": all(r["first_step_at_threshold"] is not None for r in lstm)
        and not any(r["first_step_at_threshold"] is not None for r in plain),
    }
    rows = [[r["policy"], r["seed"], f"{r['first_step_at_threshold']:,}"
             if r["first_step_at_threshold"] else "not reached", r["final_mean_return_100"],
             r["best_mean_return"], r["wall_s"]] for r in runs]
    common.print_table(
        f"CartPole-NoVel (velocities hidden), {s.total_steps:,} steps, hetrl local defaults; "
        f"target: every recurrent seed reaches mean(100) >= {s.threshold:.0f}, no "
        f"feed-forward one does: {'PASS' if summary['pass'] else 'FAIL'}",
        ["--recurrent", "seed", f"first step >= {s.threshold:.0f}", "final mean(100)",
         "best mean(100)", "wall s"], rows)
    common.write_json(record_name(s), s, {"runs": runs, "summary": summary})
    return summary


if __name__ == "__main__":
    main()
