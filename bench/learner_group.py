"""Learner group benchmark: does a 2-rank group learn as one rank does, and what does it cost?

Each (learners, seed) is one `run_local` of --env with 2 workers and --learners ranks
(torch.distributed, gloo on this CPU), 1M env steps by default, the env's preset, no
report. The runs go seed by seed, one rank then two, so a drift in the machine's load
falls on both. Reported per run: the final return (mean of the last 100 training
episodes), the area under the learning curve, wall seconds and env steps/s (as
bench.learning records them), the updates and the mean update seconds
(learner_train_seconds / policy_version); for a group also its summary's
`learner_group` figures: all-reduce seconds and all-reduces per update (and so the
all-reduce share of an update), each rank's wait and lockstep shares, and whether the
ranks' final weights are identical. Per rank count: the final return's mean ± sample
std, min and max; the verdict `two_ranks_within_one_rank_spread` says whether the
2-rank mean lies within [min, max] of the 1-rank finals (and each 2-rank seed is
checked the same way). Run: `python -m bench.learner_group` (6 runs of a few minutes
on 2 cores; the committed record is bench/results/summary_learner_group.json);
`--quick` is seed 1 at 100,000 steps or fewer, nothing committed. It measures only:
it changes no setting of the runs beyond workers, learners and steps.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from pathlib import Path

import tyro

from bench import common
from bench.learning import curve_of, record
from hetrl.launch import run_local

# The learner_group figures of a group run's summary that the record keeps.
GROUP_FIELDS = ("allreduce_seconds_per_update", "allreduces_per_update", "rank_wait_share",
                "rank_lockstep_share", "weights_identical")


@dataclasses.dataclass
class Settings:
    """HalfCheetah with one learner rank and with two: returns and the all-reduce cost."""

    env: str = "HalfCheetah-v5"
    """Env id to train (its preset's settings)."""
    learners: tuple[int, ...] = (1, 2)
    """Learner ranks per run; the first is the reference whose spread the others meet."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Seeds per rank count (min, max, mean and sample std over them)."""
    total_steps: int = 1_000_000
    """Env steps per run."""
    workers: int = 2
    """Worker processes per run (shared among the ranks; one per core here)."""
    quick: bool = False
    """Seed 1 only, at most 100,000 steps (fewer if --total-steps asks): a smoke run,
    nothing committed."""


def run_dir(learners: int, seed: int, quick: bool = False) -> Path:
    name = f"learner_group{'-quick' if quick else ''}-L{learners}-seed{seed}"
    return common.RESULTS / "runs" / name


def run_one(learners: int, seed: int, s: Settings) -> dict:
    """One run and its record (bench.learning's, plus the group's figures)."""
    out = run_dir(learners, seed, s.quick)
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    result = run_local(env=s.env, seed=seed, workers=s.workers, learners=learners,
                       total_steps=s.total_steps, out=str(out), progress=False, report=False)
    wall = time.perf_counter() - start
    if not (out / "summary.json").exists():
        return {"env": s.env, "seed": seed, "learners": learners, "ok": False,
                "exit_code": result.exit_code, "final_return": None, "wall_s": wall,
                "curve": []}
    run = record(s.env, seed, wall, out=out)
    summary = json.loads((out / "summary.json").read_text())
    updates = int(summary.get("policy_version") or 0)
    train = float(summary.get("learner_train_seconds") or 0.0)
    update_s = train / updates if updates else None
    run.update(learners=learners, exit_code=result.exit_code, outcome=summary.get("outcome"),
               updates=updates, update_seconds=update_s)
    group = summary.get("learner_group")
    if group:
        run.update({k: group.get(k) for k in GROUP_FIELDS})
        allreduce = group.get("allreduce_seconds_per_update")
        run["allreduce_share_of_update"] = (allreduce / update_s if update_s and
                                            allreduce is not None else None)
    return run


def _spread(values: list[float]) -> dict:
    """Mean, sample std, min and max of the seeds' final returns."""
    if not values:
        return {"n": 0, "mean": None, "sample_std": None, "min": None, "max": None}
    return {"n": len(values), "mean": statistics.fmean(values),
            "sample_std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def summarize(runs: list[dict], learners: tuple[int, ...]) -> dict:
    """Per rank count: the finals' spread, AUC, wall, steps/s, update and all-reduce cost;
    and whether each other count's mean (and each of its seeds) lies within the first
    count's [min, max]."""
    summary: dict = {}
    for count in learners:
        mine = [r for r in runs if r["learners"] == count and r["ok"]]
        finals = [r["final_return"] for r in mine if r["final_return"] is not None]
        shares = [r["allreduce_share_of_update"] for r in mine
                  if r.get("allreduce_share_of_update") is not None]
        summary[f"L{count}"] = {
            "learners": count,
            "runs_failed": sum(1 for r in runs if r["learners"] == count and not r["ok"]),
            "final_return": _spread(finals),
            "area_under_curve": common.summarize([r["area_under_curve"] for r in mine
                                                  if r["area_under_curve"] is not None]),
            "wall_s": common.summarize([r["wall_s"] for r in mine]),
            "learner_wall_s": common.summarize([r["learner_wall_s"] for r in mine]),
            "steps_per_s": common.summarize([r["steps_per_s"] for r in mine]),
            "update_seconds": common.summarize([r["update_seconds"] for r in mine
                                                if r["update_seconds"] is not None]),
            "allreduce_seconds_per_update": common.summarize(
                [r["allreduce_seconds_per_update"] for r in mine
                 if r.get("allreduce_seconds_per_update") is not None]),
            "allreduce_share_of_update": common.summarize(shares),
            "weights_identical": (all(r.get("weights_identical") for r in mine)
                                  if count > 1 and mine else None)}
    reference = summary[f"L{learners[0]}"]["final_return"]
    for count in learners[1:]:
        entry = summary[f"L{count}"]
        lo, hi, mean = reference["min"], reference["max"], entry["final_return"]["mean"]
        inside = (None if lo is None or mean is None else lo <= mean <= hi)
        entry["mean_within_reference_spread"] = inside
        entry["seeds_within_reference_spread"] = {
            str(r["seed"]): None if lo is None or r["final_return"] is None
            else lo <= r["final_return"] <= hi
            for r in runs if r["learners"] == count and r["ok"]}
        if count == 2:
            summary["two_ranks_within_one_rank_spread"] = inside
    return summary


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _row(count: int, entry: dict) -> list[str]:
    fr = entry["final_return"]
    spread = ("-" if fr["mean"] is None else
              f"{fr['mean']:,.0f} ± {fr['sample_std']:,.0f} [{fr['min']:,.0f}-{fr['max']:,.0f}]")
    inside = entry.get("mean_within_reference_spread")
    seeds = entry.get("seeds_within_reference_spread") or {}
    within = ("reference" if "mean_within_reference_spread" not in entry else
              {None: "-", True: "yes", False: "no"}[inside]
              + (f" ({sum(bool(v) for v in seeds.values())}/{len(seeds)} seeds)" if seeds
                 else ""))
    reduce = entry["allreduce_seconds_per_update"]
    share = entry["allreduce_share_of_update"]
    cost = "-" if not reduce["n"] else (f"{common.fmt(reduce, '.3f')} s "
                                        f"({common.fmt(share, '.0%')})")
    identical = {None: "-", True: "yes", False: "NO"}[entry["weights_identical"]]
    return [str(count), str(fr["n"]) + (f" (+{entry['runs_failed']} failed)"
                                        if entry["runs_failed"] else ""),
            spread, within, common.fmt(entry["area_under_curve"], ",.0f"),
            common.fmt(entry["learner_wall_s"], ".0f"), common.fmt(entry["steps_per_s"], ",.0f"),
            common.fmt(entry["update_seconds"], ".3f"), cost, identical]


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, seeds=(1,), total_steps=min(s.total_steps, 100_000))
    runs = []
    for seed in s.seeds:
        for count in s.learners:
            print(f"{s.env} seed {seed}, {count} learner rank(s) ...", flush=True)
            runs.append(run_one(count, seed, s))
    summary = summarize(runs, s.learners)
    common.print_table(
        f"{s.env} at {s.total_steps:,} env steps, {s.workers} workers: one learner rank "
        f"against a group (--learners), seeds {', '.join(map(str, s.seeds))}",
        ["ranks", "seeds", "final return mean ± sample std [min-max]",
         f"mean within {s.learners[0]}-rank [min-max]", "area under curve",
         "learner wall s", "env steps/s", "update s", "all-reduce s/update (share)",
         "weights identical"],
        [_row(count, summary[f"L{count}"]) for count in s.learners])
    for r in runs:
        if r["learners"] > 1 and r["ok"]:
            print(f"  seed {r['seed']}, {r['learners']} ranks: final {_number(r['final_return'])}, "
                  f"{r.get('allreduces_per_update')} all-reduces/update, wait share "
                  f"{r.get('rank_wait_share')}, lockstep share {r.get('rank_lockstep_share')}, "
                  f"weights identical {r.get('weights_identical')}")
        elif not r["ok"]:
            print(f"  seed {r['seed']}, {r['learners']} rank(s): FAILED "
                  f"({r.get('outcome') or 'exit ' + str(r['exit_code'])})")
    print(f"two_ranks_within_one_rank_spread: {summary.get('two_ranks_within_one_rank_spread')}")
    results = {"runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs],
               "summary": summary}
    common.write_json("learner_group", s, results)
    if not s.quick:  # the committed record (bench/results/summary*.json are kept in git)
        common.write_json("summary_learner_group", s, results)

    def draw(plt) -> None:
        for r in runs:
            curve = r.get("curve") or curve_of(run_dir(r["learners"], r["seed"], s.quick))
            if curve:
                plt.plot([c[0] for c in curve], [c[1] for c in curve],
                         color=f"C{s.learners.index(r['learners'])}", alpha=0.8,
                         label=f"{r['learners']} rank(s), seed {r['seed']}")
        plt.xlabel("env steps")
        plt.ylabel("mean return (last 100 episodes)")
        plt.title(f"{s.env}: learner ranks")
        plt.legend(fontsize=7)

    common.plot("learner_group" + ("-quick" if s.quick else ""), draw)
    return summary


if __name__ == "__main__":
    main()
