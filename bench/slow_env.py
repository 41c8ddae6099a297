"""Slow simulators are hetrl's best case, not a fault: a heavy env step runs at nearly
the bare envs' rate, with no stall reported, a clean stop and an env-bound verdict.

For each env, on the same 2 cores: the bare rate (2 processes, each stepping a
synchronous vector env of 8 with random actions, as the workers would, for
--seconds), then `hetrl local` with 2 workers x 8 envs x 64 steps for about as many
env steps, its rate by the learner's clock (first update to last). Envs:
`bench.envs:SlowSim` (a custom simulator, ~10 ms a step: 8 ms sleep, 2 ms CPU) and
`bench.envs:make_heavy_humanoid` (MuJoCo Humanoid-v5 at frame skip 200: a real,
CPU-bound one). Target: hetrl >= 0.85 x bare, no stalled seconds, no worker left
unstopped, verdict experience-bound with the step cost named.
Run: `python -m bench.slow_env [--quick]`; record bench/results/summary_slow_env.json.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import shutil
import time
from typing import Any

import tyro

from bench import common

TARGET = 0.85
ENVS = ("bench.envs:SlowSim", "bench.envs:make_heavy_humanoid")


@dataclasses.dataclass
class Settings:
    """Heavy simulators: hetrl against the bare envs on the same cores."""

    envs: tuple[str, ...] = ENVS
    """Env entry points to measure."""
    seconds: float = 60.0
    """Seconds of stepping for the bare rate; hetrl runs about as many env steps."""
    quick: bool = False
    """10 s per measurement, SlowSim only."""


def _bare(env: str, seconds: float, result) -> None:
    import gymnasium as gym

    from hetrl.rollout.envs import env_spec
    from hetrl.rollout.settings import EnvSettings

    spec = env_spec(EnvSettings(env=env))
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(spec) for _ in range(8)])
    envs.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(envs.action_space.sample())
        steps += 8
    result.put(steps / (time.perf_counter() - start))
    envs.close()


def bare_rate(env: str, seconds: float) -> float:
    """Env steps/s of 2 processes stepping 8 envs each, side by side."""
    queue: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_bare, args=(env, seconds, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    rates = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    return sum(rates)


def hetrl_run(env: str, steps: int) -> dict[str, Any]:
    from hetrl.launch import run_local

    name = env.split(":")[-1]
    out = common.RESULTS / "runs" / f"slow_env-{name}"
    shutil.rmtree(out, ignore_errors=True)
    result = run_local(env=env, workers=2, envs_per_worker=8, fragment_length=64,
                       total_steps=steps, seed=1, out=str(out), progress=False,
                       report=False)
    summary = result.summary
    timing = summary["timing"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0], records[-1]
    rate = (last["global_step"] - first["global_step"]) / max(
        last["wall_seconds"] - first["wall_seconds"], 1e-9)
    return {"ok": result.ok, "env_steps_per_second": rate,
            "global_step": summary["global_step"],
            "stalled_seconds": summary["stalled_seconds"],
            "stalls_warned": summary["stalled_seconds"] > 0,
            "workers_not_stopped": summary["workers_not_stopped"],
            "verdict": summary["verdict"], "verdict_text": summary["verdict_text"],
            "stop_seconds": timing["stop_seconds"], "training_seconds": timing["training_seconds"]}


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, envs=ENVS[:1], seconds=10.0)
    rows, results = [], []
    for env in s.envs:
        print(f"{env}: bare envs ...", flush=True)
        bare = bare_rate(env, s.seconds)
        print(f"{env}: hetrl local ...", flush=True)
        run = hetrl_run(env, int(bare * s.seconds))
        ratio = run["env_steps_per_second"] / bare
        ok = (ratio >= TARGET and not run["stalls_warned"] and not run["workers_not_stopped"]
              and run["verdict"] == "experience-bound")
        results.append({"env": env, "bare_env_steps_per_second": bare, **run, "ratio": ratio,
                        "pass": ok})
        rows.append([env, f"{bare:,.0f}", f"{run['env_steps_per_second']:,.0f}",
                     f"{ratio:.2f}", run["stalled_seconds"], len(run["workers_not_stopped"]),
                     f"{run['stop_seconds']:.2f}", run["verdict"], "PASS" if ok else "FAIL"])
    common.print_table(
        f"Heavy simulators: hetrl local (2 workers x 8 envs x 64 steps) against the bare "
        f"envs (2 processes x 8) on the same cores; target >= {TARGET}x, no stall",
        ["env", "bare env steps/s", "hetrl env steps/s", "hetrl / bare", "stalled s",
         "not stopped", "stop s", "verdict", ""], rows)
    for r in results:
        print(f"  {r['env']}: {r['verdict_text']}")
    common.write_json("slow_env" if s.quick else "summary_slow_env", s, {"results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
