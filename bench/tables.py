"""The figure tables of README.md and docs/, generated from the committed records.

A table lives in a page between two markers:

    <!-- table: NAME (python -m bench.tables) -->
    ...generated markdown...
    <!-- end table -->

`python -m bench.tables` rewrites every marked table from bench/results/*.json;
`python -m bench.tables --check` rewrites nothing and exits 1 naming each table that
differs from what the records give (tests/test_tables.py runs it), so a figure cannot
drift from its record, and a re-measured record shows up as a changed table.
Each table ends with the records it read: commit, date and the load when it ran.
Spreads over seeds are the sample standard deviation. Reads JSON only: no torch, no envs.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, fmt, mean_span

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"(<!-- table: (?P<name>[\w-]+) \(python -m bench\.tables\) -->\n)"
                    r"(?P<body>.*?)(<!-- end table -->)", re.S)


def _record(name: str) -> dict[str, Any]:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"bench.tables: no record {path.relative_to(ROOT)}; run the benchmark "
                         "that writes it, or drop the table that quotes it")
    return json.loads(path.read_text())


def _source(name: str, record: dict[str, Any]) -> str:
    """Where a table's figures come from: the record, its commit, date and load."""
    machine = record.get("machine", {})
    load = machine.get("loadavg_at_start")
    load_text = f", load {load[0]:.1f} at start" if load else ""
    return (f"`bench/results/{name}.json` (at {machine.get('git', '?')}, "
            f"{str(record.get('time', '?'))[:10]}{load_text})")


def _footer(*sources: str) -> str:
    return "\nRecords: " + "; ".join(sources) + ".\n"


def _median(value: Any) -> float:
    """A figure a record holds either bare or as a summarize() result."""
    return float(value["median"] if isinstance(value, dict) else value)


def _span(values: list[float], spec: str) -> str:
    """min-max of figures, or the one figure when they are all the same."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low}-{high}"


def _sample_std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _learning_by_env(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each env's seeds' final returns, its CleanRL reference and training time."""
    envs: dict[str, dict[str, Any]] = {}
    for run in record["results"]["runs"]:
        if not run.get("ok"):
            continue
        env = envs.setdefault(run["env"], {"returns": [], "seeds": [], "wall": [], "sps": [],
                                           "commits": set()})
        env["returns"].append(run["final_return"])
        env["seeds"].append(run["seed"])
        env["wall"].append(run["learner_wall_s"])
        env["sps"].append(run["steps_per_s"])
        env["commits"].add(run.get("commit", "?"))
    for name, env in envs.items():
        env["reference"] = record["results"]["summary"][name]["cleanrl"]
        env["mean"] = statistics.fmean(env["returns"])
        env["std"] = _sample_std(env["returns"])
    return envs


def _versus(env: str) -> tuple[str, dict[str, Any]] | None:
    """The 102,400-step speed record for env (one run of each side per pair)."""
    name = f"summary_versus_cleanrl-{env}-102400"
    if not (RESULTS / f"{name}.json").exists():
        return None
    return name, _record(name)


def table_solve() -> str:
    record = _record("summary_solve")
    lines = ["| seed | first step with mean(100) >= 475 "
             "| wall s to get there (from the command's start) "
             "| final mean(100) at 300k | wall s, whole command |",
             "|---|---|---|---|---|"]
    for run in record["results"]["runs"]:
        solved = run.get("solved") or {}
        step = f"{solved['global_step']:,}" if solved else "not solved"
        wall = f"{solved['wall_s']:.1f}" if solved else "-"
        lines.append(f"| {run['seed']} | {step} | {wall} | {run['final_mean_return_100']:.1f} "
                     f"| {run['command_wall_s']:.1f} |")
    return "\n".join(lines) + "\n" + _footer(_source("summary_solve", record))


def table_startup() -> str:
    record = _record("summary_startup")
    summary = record["results"]["summary"]
    rows = [("workers listening", "workers_listening_seconds"),
            ("learner's first update", "first_update_seconds"),
            ("training", "training_seconds"), ("stop", "stop_seconds"),
            ("report", "report_seconds"), ("whole command", "command_seconds")]
    lines = ["| part of `make train`'s command | seconds, median [min-max] of 3 |", "|---|---|"]
    for label, key in rows:
        stat = summary[key]
        lines.append(f"| {label} | {stat['median']:.2f} [{stat['min']:.2f}-{stat['max']:.2f}] |")
    ratio = summary["command_over_training"]
    verdict = "met" if ratio["median"] <= summary["target_ratio"] else "not met"
    lines.append(f"| whole command / training | {ratio['median']:.3f}x (target <= "
                 f"{summary['target_ratio']}x: {verdict}) |")
    return "\n".join(lines) + "\n" + _footer(_source("summary_startup", record))


def _score_at(r: dict[str, Any], step: int) -> str:
    """An Atari record's mean score at `step`: as the record kept it, or (records made
    before it kept them) its thinned curve's last point at or before it."""
    if step >= r["total_steps"] and r["finished"]:
        return f"{r['final_mean_score_100']:.1f}"
    if str(step) in r.get("score_at", {}):
        return f"{r['score_at'][str(step)]:.1f}"
    points = [p for p in r["curve"] if p[0] <= step]  # (steps, mean score, wall s)
    return f"{points[-1][1]:.1f}" if points and r["global_step"] >= step else "-"


ATARI_AB = ("summary_atari-ab-lag2", "summary_atari-ab-lag1", "summary_atari",
            "summary_atari-ab-sticky0", "summary_atari-ALE-Pong-v5-seed2",
            "summary_atari-ab-seed2-sticky0", "summary_atari-ab-seed2-sync",
            "summary_atari-ab-seed2-sync-vclip", "summary_atari-ab-seed2-cleanrl-v4",
            "summary_atari-ab-seed1-sync-vclip", "summary_atari-ab-seed1-constlr")
"""The Pong runs that chose the atari preset (the one before, then each change), then the
shipped preset on v4's rules; then the shipped preset against v4's rules again, seed 2,
and against PPO's synchronous loop (lag 0) without and with the value-loss clip (CleanRL's
algorithm), seed 2, and CleanRL's algorithm on v4's rules (CleanRL's run), seed 2; then
CleanRL's algorithm on v5 with seed 1, the record's seed; then the preset with a constant
learning rate (--no-anneal-lr), seed 1."""

V5_STICKY_ACTIONS = 0.25
"""ALE v5's default, which runs recorded before run_settings kept the field played."""


def table_atari_ab() -> str:
    """The runs that chose the atari preset's batch, lag and clip anchor (one seed each),
    and the sticky-actions A/B (two seeds)."""
    marks = range(500_000, 2_500_001, 500_000)
    lines = ["| workers x envs x steps, credits per worker | clip against | sticky actions "
             "| seed | " + " | ".join(f"{m // 1000:,}k" for m in marks)
             + " | mean lag | clip fraction: mean (updates > 0.2) | approx KL, median "
             "| commit |", "|---|---|---|---|" + "---|" * len(marks) + "---|---|---|---|"]
    sources = []
    for name in ATARI_AB:
        record = _record(name)
        r = record["results"]
        health, given = r["update_health"], r["run_settings"]
        what = (f"{given['workers']} x {given['envs_per_worker']} x {given['fragment_length']}"
                f", {given['credits_per_worker']}"
                + (", synchronous" if given.get("synchronous") else "")
                + (f", value clip {given['value_clip']:g}" if given.get("value_clip") else "")
                + (", lr constant" if given.get("anneal_lr") is False else ""))
        commits = ", ".join(dict.fromkeys(x["commit"] for x in r["sittings"]))
        sticky = given.get("atari_sticky_actions")
        lines.append(f"| {what} | {given.get('clip_against') or 'behaviour'} "
                     f"| {V5_STICKY_ACTIONS if sticky is None else sticky:g} | {r['seed']} | "
                     + " | ".join(_score_at(r, m) for m in marks)
                     + f" | {health['policy_lag_mean']:.2f} | {health['clipfrac_mean']:.2f} "
                     f"({health['clipfrac_over_0_2']:.0%}) | {health['approx_kl_median']:.4f} "
                     f"| {commits} |")
        sources.append(_source(name, record))
    return "\n".join(lines) + "\n" + _footer(*sources)


def table_atari_preprocess() -> str:
    """hetrl's Atari image against CleanRL's on the same frames (bench.atari_preprocess)."""
    record = _record("summary_atari_preprocess")
    r = record["results"]

    def shown(stat: dict[str, Any], spec: str) -> str:
        return f"{stat['mean']:{spec}} ({stat['min']:{spec}} to {stat['max']:{spec}})"

    lines = ["| images compared, 84x84 | mean difference, levels of 255 | largest difference "
             "| correlation |", "|---|---|---|---|"]
    for name, row in r.items():  # each comparison the record holds, in its order
        if not (isinstance(row, dict) and "mean_abs_diff" in row):
            continue
        lines.append(f"| {name} | {shown(row['mean_abs_diff'], '.3f')} "
                     f"| {shown(row['max_abs_diff'], '.0f')} "
                     f"| {shown(row['correlation'], '.4f')} |")
    ball = (f"\n{record['settings']['env']}, {r['steps']:,} agent steps of random play, mean "
            f"over the steps (smallest to largest). The ball, on the {r['ball_steps']:,} steps "
            f"it is in play, stands {r['ball_contrast_hetrl']['mean']:.1f} levels above the "
            f"field in hetrl's image and {r['ball_contrast_CleanRL']['mean']:.1f} in "
            f"CleanRL's, shown (10 levels or more) in {r['ball_shown_hetrl']:.1%} and "
            f"{r['ball_shown_CleanRL']:.1%} of them.\n")
    return "\n".join(lines) + "\n" + ball + _footer(_source("summary_atari_preprocess", record))


def _reached(r: dict[str, Any], milestone: str) -> str:
    """The step at which an Atari record's mean score first reached `milestone`."""
    reached = r["first_reached"].get(milestone)
    return f"{reached['step']:,}" if reached else ("never" if r["finished"] else "not yet")


def _pong_seeds() -> list[str]:
    """The records of `bench.atari_record` on its own run, seed 1 first, then each other
    seed (summary_atari-ALE-Pong-v5-seedN, by seed)."""
    seeds = {int(m[1]): path.stem for path in RESULTS.glob("summary_atari-ALE-Pong-v5-seed*.json")
             if (m := re.fullmatch(r"summary_atari-ALE-Pong-v5-seed(\d+)", path.stem))}
    return ["summary_atari"] + [seeds[seed] for seed in sorted(seeds)]


def table_atari() -> str:
    """The Atari learning record (bench.atari_record): game score over a long run, a row
    per seed."""
    lines = ["| env, seed | agent steps (frames) | mean score, last 100 games | best (at step) "
             "| first reached 0 / 15 / 20 at step | training hours (sittings) "
             "| PPO on Pong v4 at that step (SB3 zoo, 1 seed) | >= 15 |",
             "|---|---|---|---|---|---|---|---|"]
    reference = _record("summary_atari_reference")
    text, sources = [], []
    for name in _pong_seeds():
        record = _record(name)
        sources.append(_source(name, record))
        r = record["results"]
        hours = (r["learner_wall_s"] or 0) / 3600
        sittings = r["sittings"]
        load = max((x.get("foreign_cores") or 0 for x in sittings), default=0)
        best = r["best_mean_score_100"] or {}
        final = r["final_mean_score_100"]
        lines.append(
            f"| {r['env']}, {r['seed']} | {r['global_step']:,} of {r['total_steps']:,} "
            f"({r['frames']:,}) | {'-' if final is None else f'{final:.1f}'} "
            f"| {best.get('score', 0):.1f} ({best.get('step', 0):,}) "
            f"| {' / '.join(_reached(r, m) for m in ('0', '15', '20'))} "
            f"| {hours:.1f} ({len(sittings)}) "
            f"| {_reference_at(reference, r['total_steps'])} "
            f"| {'yes' if r['target_met'] else 'no'}{'' if r['finished'] else ' (so far)'} |")
        seed_flag = "" if r["seed"] == 1 else f" --seed {r['seed']}"
        state = ("finished" if r["finished"] else
                 "**unfinished**: on the machine that holds its run folder, "
                 f"`python -m bench.atari_record{seed_flag}` continues it from its newest "
                 "checkpoint")
        marks = range(500_000, r["total_steps"] + 1, 500_000)
        curve = ", ".join(f"{m // 1000:,}k: {_score_at(r, m)}" for m in marks)
        text.append(f"Seed {r['seed']}, mean score by agent step: {curve}. The run is {state}; "
                    f"other processes kept up to {load:.2f} cores busy during a sitting.")
    cleanrl = CLEANRL_PONG_10M_STEPS
    text.append(f"The reference column is the zoo's PPO at the same agent step (the "
                f"atari-reference table). CleanRL's published {cleanrl[0]:.2f} ± "
                f"{cleanrl[1]:.2f} (ppo_atari.py, 3 seeds) is at 10M agent steps, 40M "
                "frames: four times this run's.")
    sources.append(_source("summary_atari_reference", reference))
    return ("\n".join(lines) + "\n\n" + "\n\n".join(text) + "\n" + _footer(*sources))


CLEANRL_PONG_10M_STEPS = (20.36, 0.20)
"""CleanRL's docs (rl-algorithms/ppo.md): ppo_atari.py on PongNoFrameskip-v4, mean ± std
of 3 seeds at its default 10M agent steps (`total_timesteps`, 4 frames each)."""


def _reference_at(record: dict[str, Any], step: int) -> str:
    """The reference run's mean score at `step`, or '-' past its end."""
    score = record["results"]["score_at"].get(str(step))
    return "-" if score is None else f"{score:.1f}"


def _zoo(value: str | None) -> str:
    """A zoo schedule as words: `lin_2.5e-4` is 2.5e-4 annealed linearly to 0."""
    text = str(value)
    return f"{text[4:]} annealed" if text.startswith("lin_") else text


def table_atari_reference() -> str:
    """A published PPO Pong curve at the steps of the A/B table (bench.atari_reference)."""
    record = _record("summary_atari_reference")
    r = record["results"]
    marks = range(500_000, 2_500_001, 500_000)
    hp = r["hyperparameters"]
    reached = " / ".join(f"{r['first_reached'][m]:,}" if r["first_reached"][m] else "never"
                         for m in ("0", "15", "20"))
    lines = ["| run | " + " | ".join(f"{m // 1000:,}k" for m in marks)
             + " | at its end (step) | first reached 0 / 15 / 20 at step |",
             "|---|" + "---|" * len(marks) + "---|---|",
             f"| SB3 PPO, {', '.join(r['env_ids'])}, {r['envs']} envs x {hp.get('n_steps')} "
             f"steps, {hp.get('n_epochs')} epochs of {hp.get('batch_size')}, lr "
             f"{_zoo(hp.get('learning_rate'))}, clip {_zoo(hp.get('clip_range'))} "
             f"(over {float(hp.get('n_timesteps', 0)):,.0f} steps) | "
             + " | ".join(_reference_at(record, m) for m in marks)
             + f" | {r['final_mean_score_100']:.1f} ({r['global_step']:,}) | {reached} |"]
    return ("\n".join(lines) + f"\n\nFrom {r['source']}: {r['games']:,} games.\n"
            + _footer(_source("summary_atari_reference", record)))


def table_atari_reference_sticky() -> str:
    """Published curves under v5's sticky actions at the same steps: Dopamine's agents,
    each a mean over its seeds (bench.atari_reference --dopamine)."""
    name = "summary_atari_reference-dopamine"
    record = _record(name)
    r = record["results"]
    marks = list(next(iter(r["agents"].values()))["score_at"])
    lines = ["| agent (Dopamine) | seeds | " + " | ".join(f"{int(m) // 1000:,}k" for m in marks)
             + f" | seeds >= 15 at {int(marks[-1]) // 1000:,}k |",
             "|---|---|" + "---|" * len(marks) + "---|"]
    for agent, a in r["agents"].items():
        cells = [mean_span(a["score_at"][m]) for m in marks]
        met = sum(score >= 15 for score in a["score_at"][marks[-1]])
        lines.append(f"| {agent} | {a['seeds']} | " + " | ".join(cells)
                     + f" | {met} of {len(a['score_at'][marks[-1]])} |")
    return ("\n".join(lines) + f"\n\nMean (lowest to highest) of the seeds. From "
            f"{r['source']}: {r['game']}, {r['agent_steps_per_iteration']:,} agent steps "
            "per iteration.\n" + _footer(_source(name, record)))


def table_learning() -> str:
    record = _record("summary_learning")
    lines = ["| env | seeds | hetrl final return, mean ± sample std (each seed) "
             "| CleanRL reference | >= ref - std | learner wall s (env steps/s) | commit |",
             "|---|---|---|---|---|---|---|"]
    for name, env in _learning_by_env(record).items():
        ref_mean, ref_std = env["reference"]
        meets = "yes" if env["mean"] >= ref_mean - ref_std else "no"
        each = "; ".join(f"{r:,.0f}" for r in env["returns"])
        wall = "; ".join(f"{w:.0f}" for w in env["wall"])
        sps = "; ".join(f"{s:,.0f}" for s in env["sps"])
        seeds = ", ".join(str(s) for s in env["seeds"])
        lines.append(f"| {name} | {seeds} | {env['mean']:,.0f} ± {env['std']:,.0f} ({each}) "
                     f"| {ref_mean:,.2f} ± {ref_std:,.2f} | {meets} | {wall} ({sps}) "
                     f"| {', '.join(sorted(env['commits']))} |")
    return "\n".join(lines) + "\n" + _footer(_source("summary_learning", record))


def table_versus_cleanrl() -> str:
    lines = ["| env | steps | pairs | CleanRL env steps/s | hetrl env steps/s (learner clock) "
             "| hetrl / CleanRL | by process wall | CleanRL's foreign load (cores) |",
             "|---|---|---|---|---|---|---|---|"]
    sources = []
    for path in sorted(RESULTS.glob("summary_versus_cleanrl-*.json")):
        name = path.stem
        record = _record(name)
        settings, summary = record["settings"], record["results"]["summary"]
        foreign = summary["cleanrl"].get("foreign_load", {}).get("max")
        cleanrl = summary["cleanrl"]["steps_per_s"]
        lines.append(
            f"| {settings['env']} | {settings['total_steps']:,} | {cleanrl['n']} "
            f"| {cleanrl['median']:,.0f} "
            f"| {summary['hetrl']['steps_per_s']['median']:,.0f} "
            f"| **{summary['ratio_steps_per_s']['median']:.2f}x** "
            f"| {summary['ratio_steps_per_s_wall']['median']:.2f}x "
            f"| {'-' if foreign is None else f'{foreign:.2f}'} |")
        sources.append(_source(name, record))
    return "\n".join(lines) + "\n" + _footer(*sources)


def table_headline() -> str:
    """The README's figures: one row per claim, each linking its record."""
    rows: list[str] = []
    sources: list[str] = []

    solve = _record("summary_solve")
    runs = solve["results"]["runs"]
    solved = [r for r in runs if r.get("solved")]
    steps = [r["solved"]["global_step"] for r in solved]
    seconds = [r["solved"]["wall_s"] for r in solved]
    finals = ", ".join(format(r["final_mean_return_100"], ".0f") for r in runs)
    rows.append(
        f"| CartPole-v1, `make train` (300k steps), seeds 1-3 | solved (mean(100) >= 475) "
        f"by {min(steps):,}-{max(steps):,} steps, {min(seconds):.1f}-{max(seconds):.1f} s; "
        f"final {finals} | [solve](bench/results/summary_solve.json) |")
    sources.append(_source("summary_solve", solve))

    learning = _record("summary_learning")
    envs = _learning_by_env(learning)
    met = [n for n, e in envs.items() if e["mean"] >= e["reference"][0] - e["reference"][1]]
    rows.append(f"| MuJoCo at 1M steps against CleanRL's published PPO returns, 3 seeds each "
                f"| {len(met)} of {len(envs)} envs at or above the reference's mean - std "
                f"| [learning](bench/results/summary_learning.json) |")
    sources.append(_source("summary_learning", learning))

    ratios = []
    for env in envs:
        found = _versus(env)
        if found:
            ratios.append((env, found[1]["results"]["summary"]["ratio_steps_per_s"]["median"]))
            sources.append(_source(*found))
    if ratios:
        text = ", ".join(f"{env.split('-')[0]} {ratio:.1f}x" for env, ratio in ratios)
        rows.append("| Env steps/s against CleanRL's own script, same env, cores and steps "
                    f"(102,400) | {text} | [versus_cleanrl](bench/results/) |")

    slow = _record("summary_slow_env")
    for run in slow["results"]["results"]:
        env = run["env"].split(":")[-1]
        rows.append(f"| A slow simulator (`{env}`, 2 workers x 8 envs) against its bare envs "
                    f"on the same cores | {run['ratio']:.2f}x, {run['stalled_seconds']:.0f} s "
                    f"stalled, verdict {run['verdict']} "
                    "| [slow_env](bench/results/summary_slow_env.json) |")
    sources.append(_source("summary_slow_env", slow))

    soaks = _soak_records()
    for emulated in (False, True):
        tries = [r for _, r in soaks if bool(r["settings"].get("emulate")) == emulated]
        if not tries:
            continue
        kills = sum(r["results"]["faulty"]["kills"] for r in tries)
        worst = max(max(r["results"]["faulty"]["recovery_seconds"], default=0.0)
                    for r in tries)
        passed = sum(bool(r["results"]["pass"]) for r in tries)
        minutes = "/".join(f"{r['settings']['minutes']:.0f}" for r in tries)
        what = ("an emulated cluster whose env hosts are killed and replaced" if emulated
                else "worker kills, freezes and env faults")
        killed = "env host kills" if emulated else "worker kills"
        rows.append(f"| Soak: CartPole for {minutes} min under {what} "
                    f"({len(tries)} {'try' if len(tries) == 1 else 'tries'}) | {passed} of "
                    f"{len(tries)} passed: {kills} {killed}, every worker streaming again "
                    f"within {worst:.1f} s | [soak](docs/reliability.md) |")
    sources += [_source(name, record) for name, record in soaks]

    frames = _record("summary_frames")["results"]
    rows.append(f"| Atari fragments: each frame sent once, stacks rebuilt on the learner "
                f"| {frames['bytes_ratio']:.3f}x the bytes, collection "
                f"{frames['collect_and_encode_ratio']:.3f}x the time "
                "| [frames](bench/results/summary_frames.json) |")
    sources.append(_source("summary_frames", _record("summary_frames")))

    group = _record("summary_learner_group")
    by_count = {r["learners"]: r for r in group["results"]["runs"] if r["ok"]}
    summary = group["results"]["summary"]
    one, two = summary["L1"]["final_return"], summary["L2"]["final_return"]
    identical = all(r["weights_identical"] for r in group["results"]["runs"]
                    if r["learners"] > 1)
    if 2 in by_count:
        rows.append(
            f"| A learner group: HalfCheetah-v5 at 1M steps on 2 ranks (`--learners 2`, "
            f"gloo) against 1, seeds 1-3 | finals {two['min']:,.0f}-{two['max']:,.0f} "
            f"against {one['min']:,.0f}-{one['max']:,.0f}; weights identical on both ranks: "
            f"{'yes' if identical else 'no'}; all-reduces "
            f"{summary['L2']['allreduce_share_of_update']['median']:.0%} of an update on "
            "this CPU | [learner_group](bench/results/summary_learner_group.json) |")
        sources.append(_source("summary_learner_group", group))

    header = ["| what | measured on a 2-core CPU machine | record |", "|---|---|---|"]
    return "\n".join(header + rows) + "\n" + _footer(*sources)


def _soak_records() -> list[tuple[str, dict[str, Any]]]:
    """Every try of bench.soak: summary_soak[_emulate][-TAG].json."""
    return [(path.stem, _record(path.stem))
            for path in sorted(RESULTS.glob("summary_soak*.json"))]


def table_soak() -> str:
    lines = ["| try | job | minutes | kills / freezes | recovery s, median (max) | exit "
             "| final policy / fault-free, 20 episodes | env faults | passed |",
             "|---|---|---|---|---|---|---|---|---|"]
    sources = []
    for name, record in _soak_records():
        s, faulty = record["settings"], record["results"]["faulty"]
        clean = record["results"]["fault_free"]
        recovery = [r for r in faulty["recovery_seconds"] if r is not None]
        spread = (f"{statistics.median(recovery):.1f} ({max(recovery):.1f})" if recovery
                  else "-")
        lines.append(f"| {name.removeprefix('summary_')} | "
                     f"{'hetrl emulate, env hosts killed' if s.get('emulate') else 'hetrl local'} "
                     f"| {s['minutes']:.0f} | {faulty['kills']} / {faulty['freezes']} | {spread} "
                     f"| {faulty['exit_code']} | {faulty['played_return']:.0f} / "
                     f"{clean['played_return']:.0f} | {faulty['env_faults']:,} "
                     f"| {'yes' if record['results']['pass'] else 'no'} |")
        sources.append(_source(name, record))
    return "\n".join(lines) + "\n" + _footer(*sources)


def table_make_bench() -> str:
    """`make bench`'s record: overhead, transport, pipelining, learner, solve, scaling."""
    record = _record("summary")
    head = record["headline"]

    def stat(s: dict[str, Any], spec: str = ".3f") -> str:
        return fmt(s, spec)

    def met(value: float, target: float) -> str:
        return f">= {target} {'met' if value >= target else 'not met'}"

    lines = ["| benchmark | what is compared | median [min-max] | target |", "|---|---|---|---|"]
    for env, row in head.get("overhead", {}).get("envs", {}).items():
        lines.append(f"| collection overhead, {_overhead_env(env)} | one worker streaming to "
                     f"a consuming learner / the same envs and policy in one process "
                     f"| {stat(row['ratio'])} "
                     f"| {met(row['ratio']['median'], row['target'])} |")
    transport = head.get("transport", {})
    sizes = [k.split(" hetrl")[0] for k in transport if k.endswith("hetrl/raw")]
    if sizes:
        ratios = " / ".join(f"{transport[f'{s} hetrl/raw']['median']:.2f}" for s in sizes)
        lines.append(f"| transport, {' / '.join(sizes)} messages | payload MiB/s through one "
                     f"stream / raw TCP on loopback | {ratios} | >= 0.5 for 1 MiB and up |")
    pipe = head.get("pipelining")
    if pipe:
        ratio, ideal = pipe["ratio"], _median(pipe["ideal_ratio_one_worker"])
        target = _median(pipe["target_ratio"])
        lines.append(f"| pipelining, Humanoid-v5 | hetrl local, 1 worker + learner / one process "
                     f"alternating collect and train (10 epochs x 32 minibatches; training "
                     f"{_median(pipe['serial_train_fraction']):.0%} of the serial time, "
                     f"the worker waiting {_median(pipe['worker_wait_fraction']):.0%} "
                     f"in hetrl) | {stat(ratio, '.2f')} (ideal {ideal:.2f}: "
                     f"{_median(ratio) / ideal:.0%} of it) "
                     f"| {met(_median(ratio), target)} |")
    for model, s in head.get("learner_throughput", {}).items():
        lines.append(f"| learner throughput, {model} | env samples/s of one update on CPU | "
                     f"{stat(s, ',.0f')} | measured |")
    solve = head.get("solve")
    if solve:
        lines.append(f"| time to solve CartPole-v1 | wall s to mean(100) >= 475, seeds 1-3 | "
                     f"{stat(solve['solve_wall_s'], '.1f')} (whole command "
                     f"{_median(solve['command_wall_s']):.1f}) "
                     f"| < {solve['target_seconds']:.0f} s "
                     f"{'met' if solve['pass'] else 'not met'} |")
    for workers, s in head.get("scaling", {}).items():
        lines.append(f"| scaling model, {workers.replace('w=', '')} worker(s) | predicted / "
                     f"measured hetrl local env steps/s "
                     f"| {s['predicted']:,.0f} / {s['measured']:,.0f} "
                     f"({s['error']:+.1%}) | checked |")
    return "\n".join(lines) + "\n" + _footer(_source("summary", record))


def _overhead_env(env: str) -> str:
    """bench.overhead's env as a reader knows it ("pong" is bench.envs:make_pong)."""
    return "Pong 4x84x84 uint8" if env == "pong" else env


def table_overhead_detail() -> str:
    """`make bench`'s collection overhead: each env's stream and the N and T sweep."""
    record = _record("summary")
    overhead = record["headline"].get("overhead", {})
    lines = ["| env | envs per worker (N) x fragment length (T) | streamed / in-process, "
             "median [min-max] | stream MiB/s |", "|---|---|---|---|"]
    rows = [*overhead.get("envs", {}).items(),
            *((row["env"], row) for row in overhead.get("sweep", []))]
    for env, row in rows:
        lines.append(f"| {_overhead_env(env)} | {row['envs_per_worker']} x "
                     f"{row['fragment_length']} | {fmt(row['ratio'], '.3f')} "
                     f"| {_median(row['stream_mib_per_s']):.1f} |")
    return "\n".join(lines) + "\n" + _footer(_source("summary", record))


def table_inference() -> str:
    """Worker against central inference (bench.inference) and what `hetrl plan` picks."""
    record = _record("summary_inference")
    rows = record["results"]["results"]
    lines = ["| env, policy | worker env steps/s | central env steps/s | central / worker "
             "| update ms, worker / central | planner picks |", "|---|---|---|---|---|---|"]
    trips, slower = [], []
    for row in rows:
        worker = _median(row["worker_env_steps_per_second"])
        central = _median(row["central_env_steps_per_second"])
        updates = [statistics.fmean(run["update_ms"] for run in row["runs"][side])
                   for side in ("worker", "central")]
        slower.append(updates[1] / updates[0])
        trips += [row["planner"]["round_trip_us"] / 1e3]
        trips += [row["round_trip_us_emulated_host"] / 1e3] if row.get(
            "round_trip_us_emulated_host") else []
        env = "Pong" if "pong" in row["env"].lower() else row["env"]
        policy = "MLP" if row["policy"] == "mlp" else row["policy"].split(":")[-1]
        lines.append(f"| {env}, {policy} | {worker:,.0f} "
                     f"| {central:,.0f} | {central / worker:.2f}x "
                     f"| {updates[0]:,.0f} / {updates[1]:,.0f} | {row['planner_choice']} |")
    text = (f"\nThe EnvStep -> Actions round trip took {_span(trips, '.1f')} ms, "
            "on 127.0.0.1 and to an emulated env host's address alike; updates took "
            f"{_span(slower, '.1f')}x longer beside the inference thread.\n")
    return "\n".join(lines) + "\n" + text + _footer(_source("summary_inference", record))


LAG_CONDITIONS = {"quiet": "quiet", "busy": "two busy loops beside it",
                  "uneven": "worker 0 slower (2 ms a step)",
                  "stalls": "worker 0 stalls 2 s every 5 s",
                  "credits4": "4 credits per worker"}
"""bench.lag's conditions as its docstring describes them."""


def table_lag() -> str:
    """CartPole under injected policy lag (bench.lag): shipped settings against before."""
    record = _record("summary_lag")
    table = record["results"]["table"]

    def runs(cell: dict[str, Any]) -> str:
        finals = " / ".join(f"{v:.4g}" for v in sorted(cell["final"]["values"], reverse=True))
        return f"{cell['solved']}/{cell['runs']}, {cell['collapsed']}/{cell['runs']}, {finals}"

    lines = ["| condition | lag mean (max) | shipped: solved, collapsed, final mean(100) "
             "| before: solved, collapsed, final mean(100) |", "|---|---|---|---|"]
    for key, label in LAG_CONDITIONS.items():
        shipped, before = table.get(f"{key}/shipped"), table.get(f"{key}/before")
        if shipped is None or before is None:
            continue
        dropped = f"; {shipped['dropped']} dropped" if shipped["dropped"] else ""
        lines.append(f"| {label} | {_median(shipped['policy_lag_mean']):.1f} "
                     f"({shipped['policy_lag_max']}{dropped}) | {runs(shipped)} "
                     f"| {runs(before)} |")
    shipped = [cell for key, cell in table.items() if key.endswith("/shipped")]
    steps = [v for cell in shipped for v in cell["steps_to_solve"]["values"]]
    best = [v for cell in shipped for v in cell["best_played"]["values"]]
    text = (f"\nWith the shipped settings {sum(c['solved'] for c in shipped)} of "
            f"{sum(c['runs'] for c in shipped)} runs solved, in {min(steps) / 1e3:.0f}-"
            f"{max(steps) / 1e3:.0f}k env steps, {sum(c['collapsed'] for c in shipped)} "
            f"collapsed; the kept best policies played {_span(best, '.0f')} in 10 sampled "
            "episodes.\n")
    return "\n".join(lines) + "\n" + text + _footer(_source("summary_lag", record))


def table_reliability() -> str:
    """What each fault test measured in the recorded run (bench.reliability)."""
    record = _record("summary_reliability")
    r = record["results"]
    lines = ["| test | outcome | s | measured |", "|---|---|---|---|"]
    quiet = 0
    for t in r["tests"]:
        if not t["measured"] and t["outcome"] == "passed":
            quiet += 1
            continue
        file, _, name = t["test"].removeprefix("tests/reliability/").partition("::")
        said = "<br>".join(line.replace("|", "\\|").replace("\n", " ").strip()
                           for line in t["measured"]) or "-"
        lines.append(f"| `{file}::{name}` | {t['outcome']} | {t['seconds']:.0f} | {said} |")
    lines.append(f"| {quiet} more tests | passed | | nothing measured beyond their assertions |")
    total = (f"\n{r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped in "
             f"{r['wall_seconds'] / 60:.1f} min; other processes kept "
             f"{r['machine_busy_cores_foreign']:.2f} cores busy meanwhile.\n")
    return "\n".join(lines) + "\n" + total + _footer(_source("summary_reliability", record))


def table_learner_group() -> str:
    """One learner rank against a group (bench.learner_group): returns and all-reduce cost."""
    record = _record("summary_learner_group")
    settings, results = record["settings"], record["results"]
    lines = ["| ranks | seeds | final return, mean ± sample std (each seed) "
             "| within the 1-rank [min-max] | learner wall s (env steps/s) | update s "
             "| all-reduce s per update (share of the update) | all-reduces per update "
             "| wait / lockstep share, each rank | weights identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for count in settings["learners"]:
        runs = [r for r in results["runs"] if r["learners"] == count and r["ok"]]
        entry = results["summary"][f"L{count}"]
        finals = [r["final_return"] for r in runs]
        each = "; ".join(f"{f:,.0f}" for f in finals)
        spread = (f"{statistics.fmean(finals):,.0f} ± {_sample_std(finals):,.0f} ({each})"
                  if finals else "-")
        if "mean_within_reference_spread" in entry:
            seeds = entry["seeds_within_reference_spread"]
            within = (f"{'yes' if entry['mean_within_reference_spread'] else 'no'} "
                      f"({sum(bool(v) for v in seeds.values())} of {len(seeds)} seeds)")
        else:
            reference = entry["final_return"]
            within = (f"reference ({reference['min']:,.0f}-{reference['max']:,.0f})"
                      if finals else "-")
        wall = "; ".join(f"{r['learner_wall_s']:.0f}" for r in runs)
        sps = "; ".join(f"{r['steps_per_s']:,.0f}" for r in runs)
        update = "; ".join(f"{r['update_seconds']:.3f}" for r in runs)
        if count > 1:
            reduce = "; ".join(f"{r['allreduce_seconds_per_update']:.3f} "
                               f"({r['allreduce_share_of_update']:.0%})" for r in runs)
            reduces = "; ".join(f"{r['allreduces_per_update']:g}" for r in runs)
            shares = "; ".join(
                ", ".join(f"{w:.0%}" for w in r["rank_wait_share"]) + " / "
                + ", ".join(f"{w:.0%}" for w in r["rank_lockstep_share"]) for r in runs)
            identical = "yes" if all(r["weights_identical"] for r in runs) else "**no**"
        else:
            reduce = reduces = shares = identical = "-"
        failed = f" (+{entry['runs_failed']} failed)" if entry["runs_failed"] else ""
        lines.append(f"| {count} | {', '.join(str(r['seed']) for r in runs)}{failed} "
                     f"| {spread} | {within} | {wall} ({sps}) | {update} | {reduce} "
                     f"| {reduces} | {shares} | {identical} |")
    verdict = {None: "not measured", True: "yes", False: "no"}[
        results["summary"].get("two_ranks_within_one_rank_spread")]
    text = (f"\n{settings['env']}, {settings['total_steps']:,} env steps, {settings['workers']} "
            f"workers shared by the ranks; the 2-rank mean within the 1-rank seeds' "
            f"[min, max]: **{verdict}**.\n")
    return ("\n".join(lines) + "\n" + text
            + _footer(_source("summary_learner_group", record)))


def table_group_updates() -> str:
    """A learner group's update ceiling, update only (bench.group_updates)."""
    record = _record("summary_group_updates")
    settings, runs = record["settings"], record["results"]["runs"]
    lines = ["| net | ranks | samples/s per rank | group samples/s | all-reduce share of an "
             "update | vs 1 rank |", "|---|---|---|---|---|---|"]
    for r in runs:
        if "samples_per_s_group" not in r:
            lines.append(f"| {r['net']} | {r['ranks']} | - | - | - | "
                         f"{r.get('skipped') or r.get('error')} |")
            continue
        single = next((x for x in runs if x["net"] == r["net"] and x["ranks"] == 1
                       and "samples_per_s_group" in x), None)
        scale = (f"{r['samples_per_s_group'] / single['samples_per_s_group']:.2f}x"
                 if single else "-")
        share = r["allreduce_seconds_per_update"] / max(r["update_seconds"], 1e-12)
        each = " / ".join(f"{v:,.0f}" for v in r["samples_per_s_per_rank"])
        lines.append(f"| {r['net']} | {r['ranks']} | {each} | {r['samples_per_s_group']:,.0f} "
                     f"| {share:.0%} | {scale} |")
    text = (f"\n{settings['device']}, {settings['envs']} envs x {settings['steps']} steps per "
            "rank's batch, 4 epochs x 4 minibatches; mlp: Humanoid-v5's spaces and the "
            "64x64 MLP; cnn: 4 x 84 x 84 frames and the built-in CNN.\n")
    return "\n".join(lines) + "\n" + text + _footer(_source("summary_group_updates", record))


TABLES: dict[str, Callable[[], str]] = {
    "headline": table_headline,
    "solve": table_solve,
    "startup": table_startup,
    "learning": table_learning,
    "atari": table_atari,
    "atari-ab": table_atari_ab,
    "atari-preprocess": table_atari_preprocess,
    "atari-reference": table_atari_reference,
    "atari-reference-sticky": table_atari_reference_sticky,
    "versus-cleanrl": table_versus_cleanrl,
    "make-bench": table_make_bench,
    "overhead-detail": table_overhead_detail,
    "inference": table_inference,
    "lag": table_lag,
    "soak": table_soak,
    "reliability": table_reliability,
    "learner-group": table_learner_group,
    "group-updates": table_group_updates,
}


def regenerate(check: bool) -> list[str]:
    """Rewrite (or, with check, compare) every marked table; return the stale ones."""
    stale: list[str] = []
    for page in PAGES:
        text = page.read_text()

        def fill(match: re.Match[str], page: Path = page) -> str:
            name = match["name"]
            if name not in TABLES:
                raise SystemExit(f"bench.tables: {page.relative_to(ROOT)} asks for table "
                                 f"'{name}'; known: {', '.join(TABLES)}")
            body = TABLES[name]()
            if body != match["body"]:
                stale.append(f"{page.relative_to(ROOT)}: {name}")
            return match.group(1) + body + match.group(4)

        new = MARKER.sub(fill, text)
        if not check and new != text:
            page.write_text(new)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tables",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a committed table differs from its records")
    args = parser.parse_args(argv)
    stale = regenerate(check=args.check)
    if args.check and stale:
        print("tables that differ from their records (run `python -m bench.tables`):\n  "
              + "\n  ".join(stale), file=sys.stderr)
        return 1
    if not args.check:
        print(f"bench.tables: {len(stale)} table(s) rewritten"
              + (": " + ", ".join(stale) if stale else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
