"""Learning benchmark: MuJoCo against CleanRL's published PPO table at 1M env steps.

Each (env, seed) is one `run_local` with the preset hetrl picks from the env's spaces
(`continuous` for all five; no per-env flags beyond `--extra`), 1M env steps by
default. Reported per env: mean ± std over seeds of the final return (mean of the last
100 training episodes), the area under the learning curve (mean return over the run's
steps, normalised by the steps: higher learns sooner), wall seconds and env steps/s,
next to CleanRL's ppo_continuous_action
figures (docs/benchmark/ppo_continuous_action.md at tag pr-424 of vwxyzjn/cleanrl; the
v4 envs there, v5 here). A plot per env shows every seed's curve and the reference
band. Run: `python -m bench.learning [--quick]` (the full form is 15 runs of a few
minutes on 2 cores; --quick is HalfCheetah-v5, one seed). The committed record,
bench/results/summary_learning.json, accumulates: a run replaces the earlier run of the
same env and seed and keeps the others, so the table can be filled one env at a time
(each run records the commit and the machine load it ran with).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import tyro

from bench import common
from hetrl.launch import run_local

# CleanRL ppo_continuous_action.py, 1M steps, mean ± std over its seeds (v4 envs).
CLEANRL = {
    "HalfCheetah-v5": (1442.64, 46.03),
    "Walker2d-v5": (2287.95, 571.78),
    "Hopper-v5": (2382.86, 271.74),
    "InvertedPendulum-v5": (963.09, 22.20),
    "Humanoid-v5": (716.11, 49.08),
}


@dataclasses.dataclass
class Settings:
    """hetrl's MuJoCo learning against CleanRL's published PPO."""

    envs: tuple[str, ...] = tuple(CLEANRL)
    """MuJoCo v5 ids to run."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Seeds per env (mean ± sample std over them)."""
    total_steps: int = 1_000_000
    """Env steps per run (CleanRL's table is at 1M)."""
    workers: int = 2
    """Worker processes per run (one per core here)."""
    extra: tuple[str, ...] = ()
    """Extra settings for every run as name=value (e.g. learning_rate=3e-4), for
    investigations; the published figures use none."""
    quick: bool = False
    """HalfCheetah-v5 with seed 1 only."""
    from_run_dirs: bool = False
    """Run nothing: record the finished runs of --envs x --seeds from their directories
    in bench/results/runs (whole-run wall time then unknown; the learner's is kept)."""


def _overrides(extra: tuple[str, ...]) -> dict:
    values = {}
    for item in extra:
        name, _, raw = item.partition("=")
        values[name.replace("-", "_")] = json.loads(raw) if raw[:1] in "[{0123456789-." \
            or raw in ("true", "false") else raw
    return values


def run_dir(env: str, seed: int) -> Path:
    return common.RESULTS / "runs" / f"learning-{env}-seed{seed}"


def curve_of(out: Path) -> list[tuple[int, float]]:
    """(env steps, mean return of the last 100 episodes) per update of a run; [] if its
    directory is gone."""
    metrics = out / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [(r["global_step"], r["charts/mean_return_100"]) for r in
            (json.loads(line) for line in metrics.read_text().splitlines())
            if "charts/mean_return_100" in r]


def record(env: str, seed: int, wall: float | None, out: Path | None = None) -> dict:
    """A run's record, from its directory (its summary.json and metrics.jsonl; `out`,
    by default this benchmark's `run_dir(env, seed)`); `wall` None: recorded afterwards
    (--from-run-dirs), so the commit and load it ran with are not known either."""
    out = run_dir(env, seed) if out is None else out
    summary = json.loads((out / "summary.json").read_text())
    curve = curve_of(out)
    area = 0.0
    for (s0, r0), (s1, r1) in zip(curve, curve[1:], strict=False):
        area += (s1 - s0) * (r0 + r1) / 2
    span = curve[-1][0] - curve[0][0] if len(curve) > 1 else 0
    learner_wall = summary.get("wall_seconds")
    return {"env": env, "seed": seed, "ok": summary.get("outcome") == "finished",
            "commit": common.git_commit() if wall is not None else None,
            "loadavg_at_end": list(os.getloadavg()) if wall is not None else None,
            "final_return": summary.get("mean_return_100"),
            "area_under_curve": area / span if span else None,
            "wall_s": wall, "learner_wall_s": learner_wall,
            "steps_per_s": summary.get("global_step", 0) / max(learner_wall or 1e-9, 1e-9),
            "curve": curve}


def run_one(env: str, seed: int, s: Settings) -> dict:
    out = run_dir(env, seed)
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    run_local(env=env, seed=seed, workers=s.workers, total_steps=s.total_steps,
              out=str(out), progress=False, **_overrides(s.extra))
    return record(env, seed, time.perf_counter() - start)


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _with_earlier_runs(runs: list[dict], total_steps: int) -> list[dict]:
    """This invocation's runs plus the committed record's runs of other (env, seed)
    pairs at the same step count, in env order of the published table."""
    path = common.RESULTS / "summary_learning.json"
    earlier = []
    if path.exists():
        committed = json.loads(path.read_text())
        if committed.get("settings", {}).get("total_steps") == total_steps:
            earlier = committed["results"]["runs"]
    fresh = {(r["env"], r["seed"]) for r in runs}
    merged = [r for r in earlier if (r["env"], r["seed"]) not in fresh] + runs
    order = {env: i for i, env in enumerate(CLEANRL)}
    return sorted(merged, key=lambda r: (order.get(r["env"], len(order)), r["env"], r["seed"]))


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, envs=("HalfCheetah-v5",), seeds=(1,))
    runs = []
    for env in s.envs:
        for seed in s.seeds:
            if s.from_run_dirs:
                if (run_dir(env, seed) / "summary.json").exists():
                    runs.append(record(env, seed, None))
                continue
            print(f"{env} seed {seed} ...", flush=True)
            runs.append(run_one(env, seed, s))
    if not s.quick:
        runs = _with_earlier_runs(runs, s.total_steps)
    envs = list(dict.fromkeys([r["env"] for r in runs]))
    summary, rows = {}, []
    for env in envs:
        mine = [r for r in runs if r["env"] == env]
        mean, std = _mean_std([r["final_return"] for r in mine])
        auc, _ = _mean_std([r["area_under_curve"] for r in mine])
        ref_mean, ref_std = CLEANRL.get(env, (None, None))
        meets = None if mean is None or ref_mean is None else mean >= ref_mean - ref_std
        summary[env] = {"final_return_mean": mean, "final_return_std": std,
                        "area_under_curve": auc, "cleanrl": [ref_mean, ref_std],
                        "meets_reference_minus_std": meets,
                        "wall_s": common.summarize([r["wall_s"] for r in mine
                                                    if r["wall_s"] is not None]),
                        "learner_wall_s": common.summarize([r["learner_wall_s"] for r in mine]),
                        "steps_per_s": common.summarize([r["steps_per_s"] for r in mine])}
        rows.append([env, len(mine),
                     "-" if mean is None else f"{mean:,.0f} ± {std:,.0f}",
                     "-" if ref_mean is None else f"{ref_mean:,.0f} ± {ref_std:,.0f}",
                     {None: "-", True: "yes", False: "no"}[meets],
                     "-" if auc is None else f"{auc:,.0f}",
                     common.fmt(summary[env]["learner_wall_s"], ".0f"),
                     common.fmt(summary[env]["steps_per_s"], ",.0f")])
    common.print_table(
        f"Learning at {s.total_steps:,} env steps: hetrl ({s.workers} workers, settings "
        f"{' '.join(s.extra) or 'of the preset'}) vs CleanRL ppo_continuous_action (v4)",
        ["env", "seeds", "hetrl final return", "CleanRL", ">= ref - std", "area under curve",
         "training wall s", "env steps/s"], rows)

    def draw_for(env: str):
        def draw(plt) -> None:
            for r in (r for r in runs if r["env"] == env):
                curve = r.get("curve") or curve_of(run_dir(env, r["seed"]))
                if curve:  # (an earlier run's directory may be gone)
                    plt.plot([c[0] for c in curve], [c[1] for c in curve],
                             label=f"hetrl seed {r['seed']}")
            ref_mean, ref_std = CLEANRL.get(env, (None, None))
            if ref_mean is not None:
                plt.axhspan(ref_mean - ref_std, ref_mean + ref_std, alpha=0.2, color="grey",
                            label="CleanRL at 1M (mean ± std)")
            plt.xlabel("env steps")
            plt.ylabel("mean return (last 100 episodes)")
            plt.title(env)
            plt.legend(fontsize=7)
        return draw

    results = {"runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs],
               "summary": summary}
    common.write_json("learning", s, results)
    if not s.quick:  # the committed record (bench/results/summary*.json are kept in git)
        common.write_json("summary_learning", s, results)
    for env in envs:  # plotted after the records are safe; seeds whose directory is gone
        common.plot(f"learning-{env}" + ("-quick" if s.quick else ""), draw_for(env))
    return summary


if __name__ == "__main__":
    main()
