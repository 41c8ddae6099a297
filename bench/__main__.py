"""`python -m bench [--quick] [--only NAME ...]`: run hetrl's benchmarks one after another.

Each benchmark runs as its own process (`python -m bench.NAME`), so CPU pinning and
torch thread settings of one cannot leak into the next, and one that fails does not
stop the others. Afterwards the headline figures of every result file are collected
in bench/results/summary.json (small; the one results file kept in git; a --quick run
writes quick-summary.json, which git ignores) and printed.
Not in the suite: bench.learning (1M env steps per env and seed: hours),
bench.lag (30 CartPole runs under injected policy lag: about 40 minutes),
bench.learner_group (6 HalfCheetah runs of 1M steps, 1 and 2 learner ranks: about 20
minutes), bench.atari_record (Pong to 2.5M steps: hours on 2 cores, over several
sittings) and bench.versus_cleanrl (needs a copy of CleanRL's script); run them on their own.
Exit status: non-zero if any benchmark failed to run (a missed target is reported,
not treated as a failure: the figures are what matter).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import tyro

from bench import common

BENCHES = ("learner_throughput", "transport", "overhead", "pipelining", "scaling", "solve",
           "learner_scale", "inference", "startup", "group_updates")
# Benchmarks whose record is kept in git write it under this name instead of their own.
RESULT_NAMES = {"inference": "summary_inference", "startup": "summary_startup",
                "solve": "summary_solve", "group_updates": "summary_group_updates"}


@dataclasses.dataclass
class Settings:
    """Run every benchmark (or --only some) and summarize them."""

    quick: bool = False
    """Pass --quick to each: a smoke run of the whole suite in a few minutes."""
    only: tuple[str, ...] = ()
    """Run only these (names from bench/: learner_throughput, transport, overhead, ...)."""
    summarize_only: bool = False
    """Run nothing; rebuild the summary from the result files already there."""


def _headline(name: str, results: dict) -> dict:
    """The figures worth one line each, from a benchmark's JSON results."""
    r = results["results"]
    if name == "overhead":
        keys = ("envs_per_worker", "fragment_length", "ratio", "stream_mib_per_s")
        envs = {row["env"]: {"target": r["targets"].get(row["env"])} | {k: row[k] for k in keys}
                for row in r["headline"]}
        sweep = [{"env": row["env"]} | {k: row[k] for k in keys} for row in r.get("sweep", [])]
        return {"envs": envs, "sweep": sweep}
    if name == "transport":
        return {f"{row['size_kib']} KiB {name}/raw": row[f"{name} / raw"]
                for row in r["sizes"] for name in ("hetrl", "pb-objects")}
    if name == "learner_throughput":
        from bench.learner_throughput import label  # here: it imports torch
        return {label(row): row["samples_per_s"] for row in r}
    if name == "solve":
        return r["summary"]
    if name == "learner_scale":
        keys = ("ingest_samples_per_s", "ceiling_samples_per_s", "ingest_over_ceiling",
                "learner_busy", "gpu_busy_percent", "policy_lag_mean", "dropped_lag")
        return {f"{row['model']} x{row['workers']} {row['device']}": {k: row[k] for k in keys}
                for row in r["runs"]}
    if name == "group_updates":
        return {f"{row['net']} x{row['ranks']}": row.get("samples_per_s_group", row.get(
            "skipped", row.get("error"))) for row in r["runs"]}
    if name == "inference":
        return {row["env"]: {"worker": row["worker_env_steps_per_second"]["median"],
                             "central": row["central_env_steps_per_second"]["median"],
                             "winner": row["measured_winner"], "planner": row["planner_choice"]}
                for row in r["results"]}
    if isinstance(r, dict) and "summary" in r:
        return r["summary"]
    return {}


def main(argv: list[str] | None = None) -> int:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    names = [n for n in BENCHES if (not s.only or n in s.only)
             and (common.RESULTS.parent / f"{n}.py").exists()]
    status, summary = {}, {}
    for name in names:
        code = 0
        if not s.summarize_only:
            print(f"\n===== bench.{name} =====", flush=True)
            start = time.perf_counter()
            code = subprocess.call([sys.executable, "-m", f"bench.{name}",
                                    *(["--quick"] if s.quick else [])], cwd=common.ROOT)
            status[name] = {"exit_code": code, "seconds": round(time.perf_counter() - start, 1)}
        path = common.RESULTS / f"{common.stem(RESULT_NAMES.get(name, name), s)}.json"
        if code == 0 and path.exists():
            summary[name] = _headline(name, json.loads(path.read_text()))
    # Only summary*.json is kept in git; a smoke run's summary is not.
    out = common.RESULTS / ("quick-summary.json" if s.quick else "summary.json")
    out.write_text(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "machine": common.machine_info(), "status": status,
                               "headline": summary}, indent=2, default=str))
    if status:
        common.print_table("bench suite", ["benchmark", "exit", "seconds"],
                           [[n, v["exit_code"], v["seconds"]] for n, v in status.items()])
    print(f"wrote {out.relative_to(common.ROOT)}")
    return 1 if any(v["exit_code"] for v in status.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
