"""Learning under policy lag: does a run that solves CartPole-v1 stay solved when its
experience arrives late?

Each run is `launch.run_local` (real worker and learner processes, gRPC on loopback) on
CartPole-v1 for 200k env steps, under one of these conditions:

- quiet: nothing else runs;
- busy: two busy-loop processes beside it on the 2 cores (what a shared machine does);
- uneven: worker 0 is several times slower than worker 1 (its first env sleeps each
  step), so its fragments are trained several updates late;
- stalls: worker 0 freezes for 2 s every 5 s, so its fragments arrive tens of updates
  late (past --max-policy-lag: dropped and counted);
- credits4: each worker may run 4 fragments ahead (--credits-per-worker 4).

and one of two settings: `shipped` (today's defaults) and `before` (the defaults before
bench/lag.py: V-trace advantages on raw rewards, `--advantages vtrace
--no-normalize-rewards`). The lagged conditions use `bench.envs:LaggyCartPole`, CartPole
itself with the delays injected in one worker's first env. A run counts as collapsed
when its mean return(100) reached 475 and ended below it. Per run the record keeps the
curve, the policy-lag histogram, the critic's and the actor's shares of the gradient,
the best policy kept (played for 10 sampled episodes) and the load the machine carried.
Run: `python -m bench.lag [--quick]`; the committed record is
bench/results/summary_lag.json, the curves bench/results/lag-<condition>.png.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import tyro

from bench import common
from bench.envs import SLOW_WORKER, STALL_EVERY, STALL_SECONDS, STEP_SLEEP
from hetrl.launch import run_local
from hetrl.rollout.evaluate import evaluate, load_policy

SOLVED = 475.0
CONDITIONS: dict[str, dict[str, Any]] = {
    "quiet": {},
    "busy": {"busy_loops": 2},
    "uneven": {"env": "bench.envs:LaggyCartPole", "environ": {SLOW_WORKER: "0",
                                                              STEP_SLEEP: "0.002"}},
    "stalls": {"env": "bench.envs:LaggyCartPole", "environ": {
        SLOW_WORKER: "0", STALL_EVERY: "5", STALL_SECONDS: "2"}},
    "credits4": {"settings": {"credits_per_worker": 4}},
}
SETTINGS = {
    "shipped": {},
    "before": {"advantages": "vtrace", "normalize_rewards": False},
}


@dataclasses.dataclass
class Settings:
    """CartPole-v1 under injected policy lag, with today's defaults and the ones before."""

    conditions: tuple[str, ...] = tuple(CONDITIONS)
    """Which conditions to run (quiet, busy, uneven, stalls, credits4)."""
    settings: tuple[str, ...] = tuple(SETTINGS)
    """Which settings to run: shipped (the defaults) and before (V-trace advantages, raw
    rewards)."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Seeds per condition and settings."""
    total_steps: int = 200_000
    """Env steps per run."""
    quick: bool = False
    """One seed, quiet and uneven only, 60k steps (a smoke run)."""


def _busy_cores(start: tuple[float, float], end: tuple[float, float]) -> float:
    return (end[1] - start[1]) / max(end[0] - start[0], 1e-9)


def _cpu_now() -> tuple[float, float]:
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    return time.monotonic(), busy


def run_one(condition: str, setting: str, seed: int, s: Settings) -> dict[str, Any]:
    spec = CONDITIONS[condition]
    out = common.RESULTS / "runs" / f"lag-{condition}-{setting}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    saved = {k: os.environ.get(k) for k in spec.get("environ", {})}
    os.environ.update(spec.get("environ", {}))
    loops = [subprocess.Popen(["bash", "-c", "while :; do :; done"])
             for _ in range(spec.get("busy_loops", 0))]
    cpu_start, load_start = _cpu_now(), os.getloadavg()[0]
    try:
        result = run_local(env=spec.get("env", "CartPole-v1"), total_steps=s.total_steps,
                           seed=seed, out=str(out), progress=False, report=False,
                           metrics_every=0,  # a row per update: the whole curve
                           **spec.get("settings", {}), **SETTINGS[setting])
    finally:
        for loop in loops:
            loop.kill()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    busy_cores = _busy_cores(cpu_start, _cpu_now())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["global_step"], r["charts/mean_return_100"]) for r in records
             if "charts/mean_return_100" in r]
    solved_at = next((step for step, mean in curve if mean >= SOLVED), None)
    after = [mean for step, mean in curve if solved_at is not None and step >= solved_at]
    half = [r for r in records if r["global_step"] >= s.total_steps / 2]
    summary = result.summary
    final = summary.get("mean_return_100")
    lags = summary.get("policy_lag_histogram", {})
    trained = sum(lags.values()) or 1
    best = summary.get("best")
    best_play = None
    if best:
        played = evaluate(load_policy(out, "best"), episodes=10, seed=1000)
        best_play = played.mean_return

    def median(key: str) -> float | None:
        values = [r[key] for r in half if key in r]
        return round(statistics.median(values), 4) if values else None

    return {
        "condition": condition, "settings": setting, "seed": seed, "ok": result.ok,
        "final_mean_return_100": final, "max_mean_return_100": max(m for _, m in curve),
        "solved_at_step": solved_at, "min_after_solved": min(after) if after else None,
        "collapsed": solved_at is not None and final is not None and final < SOLVED,
        "policy_lag_mean": sum(int(k) * v for k, v in lags.items()) / trained,
        "policy_lag_max": max((int(k) for k in lags), default=0),
        "policy_lag_histogram": lags,
        "fragments_dropped_lag": summary.get("fragments_dropped_lag"),
        "second_half_median": {k: median(f"losses/{k}") for k in (
            "value_loss", "entropy", "clipfrac", "actor_grad_share", "grad_norm")},
        "best": best, "best_played_mean_return": best_play,
        "training_seconds": summary.get("wall_seconds"),
        "machine_busy_cores": round(busy_cores, 2), "loadavg_1min_start": load_start,
        "loadavg_1min_end": os.getloadavg()[0],
        "curve": curve,
    }


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, conditions=("quiet", "uneven"), seeds=(1,),
                                total_steps=60_000)
    runs = []
    for condition in s.conditions:
        for setting in s.settings:
            for seed in s.seeds:
                print(f"{condition} / {setting} / seed {seed} ...", flush=True)
                runs.append(run_one(condition, setting, seed, s))
                r = runs[-1]
                print(f"  final {r['final_mean_return_100']:.1f}, max "
                      f"{r['max_mean_return_100']:.1f}, lag {r['policy_lag_mean']:.2f} "
                      f"(max {r['policy_lag_max']}), dropped {r['fragments_dropped_lag']}, "
                      f"actor share {r['second_half_median']['actor_grad_share']}", flush=True)
    rows, table = [], {}
    for condition in s.conditions:
        for setting in s.settings:
            group = [r for r in runs if r["condition"] == condition and r["settings"] == setting]
            if not group:
                continue
            row = {
                "final": common.summarize([r["final_mean_return_100"] for r in group]),
                "collapsed": sum(r["collapsed"] for r in group),
                "solved": sum(r["solved_at_step"] is not None for r in group),
                "runs": len(group),
                "steps_to_solve": common.summarize(
                    [r["solved_at_step"] for r in group if r["solved_at_step"]]),
                "policy_lag_mean": common.summarize([r["policy_lag_mean"] for r in group]),
                "policy_lag_max": max(r["policy_lag_max"] for r in group),
                "dropped": sum(r["fragments_dropped_lag"] or 0 for r in group),
                "actor_grad_share": common.summarize(
                    [r["second_half_median"]["actor_grad_share"] for r in group
                     if r["second_half_median"]["actor_grad_share"] is not None]),
                "entropy": common.summarize([r["second_half_median"]["entropy"] for r in group
                                             if r["second_half_median"]["entropy"] is not None]),
                "best_played": common.summarize([r["best_played_mean_return"] for r in group
                                                 if r["best_played_mean_return"] is not None]),
                "machine_busy_cores": common.summarize([r["machine_busy_cores"]
                                                        for r in group]),
            }
            table[f"{condition}/{setting}"] = row
            rows.append([condition, setting, f"{row['solved']}/{row['runs']}",
                         f"{row['collapsed']}/{row['runs']}", common.fmt(row["final"], ".1f"),
                         common.fmt(row["steps_to_solve"]),
                         common.fmt(row["policy_lag_mean"], ".2f"), row["policy_lag_max"],
                         row["dropped"], common.fmt(row["actor_grad_share"], ".3f"),
                         common.fmt(row["entropy"], ".2f"), common.fmt(row["best_played"], ".0f"),
                         common.fmt(row["machine_busy_cores"], ".1f")])
    common.print_table(
        f"CartPole-v1 under policy lag, {s.total_steps:,} steps, seeds "
        f"{', '.join(map(str, s.seeds))} (collapsed: reached {SOLVED:.0f}, ended below)",
        ["condition", "settings", "solved", "collapsed", "final mean(100)", "steps to solve",
         "lag mean", "lag max", "dropped", "actor grad share", "entropy", "best plays",
         "busy cores"], rows)
    name = "lag" if s.quick else "summary_lag"
    common.write_json(name, s, {"table": table, "runs": runs})
    for condition in s.conditions:
        group = [r for r in runs if r["condition"] == condition]

        def draw(plt, group=group, condition=condition):
            colours = {"shipped": "tab:blue", "before": "tab:red"}
            for r in group:
                steps, means = zip(*r["curve"], strict=True) if r["curve"] else ((), ())
                plt.plot(steps, means, color=colours.get(r["settings"], "gray"), alpha=0.7,
                         label=f"{r['settings']} seed {r['seed']}")
            plt.axhline(SOLVED, color="gray", linestyle=":")
            plt.xlabel("env steps")
            plt.ylabel("mean return (last 100 episodes)")
            plt.title(f"CartPole-v1, {condition}")
            plt.legend(fontsize=7)

        common.plot(f"lag-{condition}", draw, enabled=not s.quick)
    return table


if __name__ == "__main__":
    main()
