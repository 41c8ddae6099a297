"""Atari learning record: `hetrl local --env ALE/Pong-v5 --total-steps 2500000` with no
other flag (the atari preset: the standard Atari pipeline and the Nature CNN), seed 1,
beside a published PPO curve at the same steps (bench.atari_reference).

The job runs as the user would start it, in a child process, into
bench/results/runs/atari-<env>-seed<N>. On 2 cores it takes hours, more than one sitting:
stop this command (Ctrl-C or SIGTERM; the job writes a checkpoint as it stops) and run it
again, and it continues the run with `--resume`. Each sitting is recorded: when, the
commit, its wall seconds and the cores other processes kept busy meanwhile.
`--record-only` runs nothing and records the run's directory as it stands (an unfinished
run says so). `--run-dir D --tag T` works on a run of other settings (an A/B), started by
hand with `hetrl local --out D ...`: it continues that run in sittings like its own, or
with `--record-only` records it as it stands, as summary_atari-T.json. Reported: the
mean game score of the last 100 whole games (unclipped, as the learner reports them)
over env steps and wall time, the first step at which it reached 0, 15 and 20, the
target (a mean score >= 15 at the end), the settings that shape the batch and the lag,
and the update's health along the run (mean policy lag, clip fraction, approx KL).

Reference: 2.5M agent steps are 10M frames. CleanRL's and the SB3 zoo's published
Pong figures come after 10M agent steps (40M frames); the curve drawn beside hetrl's is
the zoo's PPO at the same steps (bench/results/summary_atari_reference.json, one seed of
PongNoFrameskip-v4: v4's rules, no sticky actions; ALE/Pong-v5 repeats the previous
action with probability 0.25, which makes it harder).
Run: `python -m bench.atari_record [--seed N] [--record-only] [--quick]`; record
bench/results/summary_atari.json (another game or seed: summary_atari-<env>-seed<N>.json,
an A/B: summary_atari-<tag>.json), curve bench/results/atari-<env>[-seed<N>|-<tag>].png.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import tyro

from bench import common
from hetrl.launch import report
from hetrl.rollout.errors import ConfigError

REFERENCE = common.RESULTS / "summary_atari_reference.json"
"""A published PPO curve on Pong at the record's steps (bench.atari_reference)."""
MILESTONES = (0.0, 15.0, 20.0)
CURVE_POINTS = 200
SCORE_EVERY = 500_000
"""Agent steps between the scores the record keeps exactly (the curve is thinned)."""


@dataclasses.dataclass
class Settings:
    """A long Atari run with the defaults, resumable across sittings, and its record."""

    env: str = "ALE/Pong-v5"
    """The Atari game (an ALE id)."""
    seed: int = 1
    total_steps: int = 2_500_000
    """Agent steps (4 frames each): 2.5M are 10M frames."""
    target: float = 15.0
    """Mean score of the last 100 games the run must reach by the end."""
    record_only: bool = False
    """Run nothing: record the run's directory as it stands."""
    quick: bool = False
    """A 4,096-step smoke run into its own directory (record atari_record-quick.json)."""
    run_dir: str = ""
    """A run started by hand (`hetrl local --out D` with its own flags) to continue with
    --resume, or with --record-only to record, instead of this checkout's own."""
    tag: str = ""
    """Record as summary_atari-TAG.json (for --run-dir: a run of other settings). Without
    it, another game or seed than Pong's seed 1 records as summary_atari-GAME-seedN.json."""


# What shapes the batch, the lag and the update, as the run's settings.json says.
RUN_SETTINGS = ("workers", "envs_per_worker", "fragment_length", "credits_per_worker",
                "fragments_per_batch", "target_policy_lag", "synchronous", "clip_coef",
                "clip_against", "epochs", "minibatches", "learning_rate", "anneal_lr",
                "value_clip", "atari_sticky_actions", "learner_torch_threads", "preset")


def run_dir(s: Settings) -> Path:
    if s.run_dir:
        return Path(s.run_dir).resolve()
    name = f"atari-{s.env.replace('/', '-')}-seed{s.seed}" + ("-quick" if s.quick else "")
    return common.RESULTS / "runs" / name


def record_names(s: Settings) -> tuple[str, str]:
    """(the record's name, its curve's): Pong seed 1 is the issue's record, summary_atari;
    any other game or seed gets its own names, and an A/B (--run-dir, which needs --tag)
    its tag's, so that none overwrites another."""
    game = f"atari-{s.env.replace('/', '-')}"
    if s.quick:
        return "atari_record", f"{game}-quick"
    if s.tag:
        return f"summary_atari-{s.tag}", f"{game}-{s.tag}"
    defaults = Settings()
    if (s.env, s.seed) == (defaults.env, defaults.seed):
        return "summary_atari", game
    return f"summary_{game}-seed{s.seed}", f"{game}-seed{s.seed}"


def _finished(out: Path) -> bool:
    summary = out / "summary.json"
    return summary.exists() and json.loads(summary.read_text()).get("outcome") == "finished"


def sit(s: Settings, out: Path, save: Any) -> dict[str, Any]:
    """One sitting: start the run, or continue it; return what the sitting did, also
    handed to `save` every minute (so a sitting cut short by a kill is still counted)."""
    resume = (out / "settings.json").exists()
    # A resumed run takes every setting from its settings.json, its own flags included.
    command = [sys.executable, "-m", "hetrl.launch", "local", "--out", str(out),
               "--no-progress"] + (["--resume"] if resume else
                                   ["--env", s.env, "--total-steps", str(s.total_steps),
                                    "--seed", str(s.seed)])
    out.parent.mkdir(parents=True, exist_ok=True)
    sitting: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "commit": common.git_commit(), "resumed": resume,
                               "step_at_start": _last_step(out)}
    print("$ hetrl " + " ".join(command[3:]), flush=True)
    with (out.parent / f"{out.name}.log").open("a") as log:
        proc = subprocess.Popen(command, cwd=common.ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                start_new_session=True)
    machine_busy, started = _machine_busy(), time.monotonic()
    ours: dict[int, float] = {}  # CPU seconds of each process of the job, last seen

    def stop(signum: int, _frame: Any) -> None:  # the job checkpoints as it stops
        proc.send_signal(signal.SIGTERM)

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    def books() -> None:
        elapsed = time.monotonic() - started
        foreign = (_machine_busy() - machine_busy - sum(ours.values())) / max(elapsed, 1e-9)
        sitting.update(wall_s=round(elapsed, 1), exit_code=proc.returncode,
                       step_at_end=_last_step(out),
                       job_cores=round(sum(ours.values()) / max(elapsed, 1e-9), 2),
                       foreign_cores=round(max(foreign, 0.0), 2))
        save(sitting)

    try:
        while proc.poll() is None:
            _job_cpu(proc.pid, ours)
            if time.monotonic() - started > 60 * (1 + int(sitting.get("wall_s", 0) // 60)):
                books()
            time.sleep(5.0)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    books()
    code = proc.returncode
    print(f"sitting ended (exit {code}) at step {sitting['step_at_end']:,} after "
          f"{sitting['wall_s']:,.0f} s", flush=True)
    return sitting


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _job_cpu(pid: int, seen: dict[int, float]) -> None:
    """Note the CPU seconds of the job's process tree (a process that has exited keeps the
    figure last seen: its last seconds are missed, at most a sampling interval's)."""
    try:
        tree = [psutil.Process(pid)]
        tree += tree[0].children(recursive=True)
    except psutil.Error:
        return
    for process in tree:
        try:
            cpu = process.cpu_times()
        except psutil.Error:
            continue
        seen[process.pid] = cpu.user + cpu.system


def _run(out: Path) -> report.Run | None:
    """The run in `out` as `hetrl report` reads it, or None before it has written any."""
    try:
        return report.Run(out)
    except ConfigError:
        return None


def _last_step(out: Path) -> int:
    run = _run(out)
    return int(run.records[-1]["global_step"]) if run and run.records else 0


def record(s: Settings, out: Path, sittings: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's record from its directory: score curve, milestones, time, sittings."""
    run = _run(out)
    rows = run.records if run else []
    try:
        curve = report.return_curve(run) if run else []
    except ConfigError:  # no game has ended yet
        curve = []
    # Best and first-to-reach are judged as `hetrl report` judges them: once 100 games
    # have ended.
    judged = report.judged(curve)
    stride = max(1, len(curve) // CURVE_POINTS)
    sampled = curve[::stride] + ([curve[-1]] if curve and (len(curve) - 1) % stride else [])
    summary = run.summary if run else {}
    final = curve[-1].value if curve else None
    best = max(judged, key=lambda point: point.value, default=None)
    reached = {f"{m:g}": report.first_reaching(judged, m) for m in MILESTONES}
    first = {m: None if p is None else {"step": p.step, "wall_s": p.seconds}
             for m, p in reached.items()}
    step = int(rows[-1]["global_step"]) if rows else 0
    given = (run.settings() if run else None) or {}
    return {"env": s.env, "run_settings": {k: given.get(k) for k in RUN_SETTINGS},
            "update_health": _health(rows), "seed": s.seed, "total_steps": s.total_steps,
            "frames": given.get("atari_frame_skip", 4) * step, "global_step": step,
            "finished": _finished(out) and step >= s.total_steps,
            "final_mean_score_100": final,
            "best_mean_score_100": None if best is None else {"score": best.value,
                                                                   "step": best.step},
            "first_reached": first,
            "score_at": _score_at(curve, step),
            "target": s.target,
            "target_met": final is not None and final >= s.target,
            "learner_wall_s": float(rows[-1]["wall_seconds"]) if rows else None,
            "sittings_wall_s": round(sum(x.get("wall_s") or 0 for x in sittings), 1),
            "episodes": summary.get("episodes"),
            "worker_restarts": summary.get("worker_restarts"),
            "outcome": summary.get("outcome"),
            "sittings": sittings,
            "curve": [[p.step, round(p.value, 2), round(p.seconds, 1)] for p in sampled]}


def _score_at(curve: list[report.Point], step: int) -> dict[str, float]:
    """The mean score every SCORE_EVERY steps the run has reached, from the whole curve
    (its last point at or before the step), so a milestone does not move as the kept
    curve's stride grows with the run."""
    scores = {}
    for mark in range(SCORE_EVERY, step + 1, SCORE_EVERY):
        before = [p for p in curve if p.step <= mark]
        if before:
            scores[str(mark)] = round(before[-1].value, 2)
    return scores


def _health(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How the updates went along the run: the lag they trained at, how much of each batch
    PPO's clip silenced, and how far each update moved the policy."""
    def column(key: str) -> list[float]:
        return [float(r[key]) for r in rows if key in r]

    lag, clipped, kl = (column("charts/policy_lag"), column("losses/clipfrac"),
                        column("losses/approx_kl"))
    return {"updates_logged": len(clipped),
            "policy_lag_mean": statistics.fmean(lag) if lag else None,
            "clipfrac_mean": statistics.fmean(clipped) if clipped else None,
            "clipfrac_over_0_2": (sum(c > 0.2 for c in clipped) / len(clipped)
                                  if clipped else None),
            "approx_kl_median": statistics.median(kl) if kl else None}


def _refuse(s: Settings) -> None:
    """Say before anything runs what a combination of flags cannot do."""
    def refuse(why: str) -> None:
        raise SystemExit(f"bench.atari_record: {why}")

    if s.quick and (s.run_dir or s.tag):
        refuse("--quick is a smoke run of its own: drop --run-dir and --tag")
    if s.tag and not s.run_dir:
        refuse("--tag names a run made elsewhere: give its --run-dir")
    if s.run_dir and not s.tag:
        refuse("--run-dir is a run of other settings: give it --tag T, and it records as "
               "summary_atari-T.json (without a tag it would overwrite the default run's)")
    if re.search(r"-seed\d+$", s.tag):
        refuse(f"--tag {s.tag} would share a name with a default run of another seed "
               "(summary_atari-GAME-seedN): pick a tag that does not end in -seedN")


def _as_saved(s: Settings, out: Path) -> Settings:
    """The run's env, seed and length as its settings.json says (a resumed sitting takes
    every setting from there, whatever this command's flags)."""
    path = out / "settings.json"
    if not path.exists():
        return s
    saved = json.loads(path.read_text())
    kept = {k: saved[k] for k in ("env", "seed", "total_steps") if k in saved}
    changed = {k: v for k, v in kept.items() if getattr(s, k) != v}
    if changed:
        print(f"bench.atari_record: the run in {out} keeps its own "
              + ", ".join(f"{k}={v}" for k, v in changed.items()), flush=True)
    return dataclasses.replace(s, **kept)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, total_steps=4096)
    _refuse(s)
    out = run_dir(s)
    if s.run_dir and not s.record_only and not (out / "settings.json").exists():
        raise SystemExit(f"bench.atari_record: {out} holds no run to continue; start it "
                         f"with `hetrl local --out {out} ...` (the settings of the A/B), "
                         "then run this again")
    s = _as_saved(s, out)
    sittings_path = out.parent / f"{out.name}.sittings.json"
    sittings = json.loads(sittings_path.read_text()) if sittings_path.exists() else []
    if not s.record_only and not _finished(out):
        def save(sitting: dict[str, Any]) -> None:
            sittings_path.write_text(json.dumps([*sittings, sitting], indent=2))

        sittings.append(sit(s, out, save))
    result = record(s, out, sittings)
    def shown(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    reached = result["first_reached"]["15"]
    common.print_table(
        f"{s.env} with {f'the settings of {s.tag}' if s.tag else 'the defaults'}, "
        f"seed {s.seed}: mean score of the last 100 games",
        ["env steps", "frames", "final score", "best", "reached 15 at step", "learner wall s",
         "sittings", "finished", f">= {s.target:g}"],
        [[f"{result['global_step']:,}", f"{result['frames']:,}",
          shown(result["final_mean_score_100"], ".1f"),
          shown((result["best_mean_score_100"] or {}).get("score"), ".1f"),
          shown(reached and reached["step"], ","), shown(result["learner_wall_s"], ",.0f"),
          len(sittings), result["finished"], result["target_met"]]])
    name, curve_name = record_names(s)
    common.write_json(name, s, result)

    def draw(plt) -> None:
        plt.plot([p[0] for p in result["curve"]], [p[1] for p in result["curve"]],
                 label=f"hetrl {s.env} seed {s.seed}")
        if REFERENCE.is_file():
            ref = json.loads(REFERENCE.read_text())["results"]
            at = sorted((int(k), v) for k, v in ref["score_at"].items()
                        if int(k) <= s.total_steps)
            plt.plot([a for a, _ in at], [v for _, v in at], linestyle="--", color="grey",
                     label=f"SB3 zoo PPO, {', '.join(ref['env_ids'])} (1 seed)")
        plt.axhline(s.target, linestyle=":", color="grey", label=f"target {s.target:g}")
        plt.xlabel("agent steps (4 frames each)")
        plt.ylabel("mean score, last 100 games")
        plt.legend(fontsize=7)

    common.plot(curve_name, draw)
    return result


if __name__ == "__main__":
    main()
