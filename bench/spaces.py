"""Spaces: every kind of observation and action space hetrl takes, learned by `hetrl
local` (2 workers x 8 envs, shipped defaults, seed 1) with worker and central inference.

The envs are the tests' own puzzles (tests/fixtures/envs.py: MatchCode's MultiDiscrete
actions with a start, CopyBits' MultiBinary (2, 3), PointAt's Box (2, 2), SpotTheLight's
Dict of a 3x32x32 image and a vector, RememberCue's memory with --recurrent lstm) and
MiniGrid-Empty-5x5 from the registry (a Dict of a 7x7x3 grid and a direction, its
mission text dropped). Each row gives the first step at which mean(100) reached the
bar, the final mean(100), and what random play scores. Run: `python -m bench.spaces
[--quick]`; record bench/results/summary_spaces.json.
"""

from __future__ import annotations

import dataclasses
import shutil
import time

import tyro

from bench import common
from bench.memory import first_reaching
from hetrl.launch import run_local

# name: (env, steps, bar, random play, extra settings)
CASES: dict[str, tuple[str, int, float, float, dict]] = {
    "MatchCode": ("tests.fixtures.envs:MatchCode", 60_000, 13.0, 4.4, {}),
    "CopyBits": ("tests.fixtures.envs:CopyBits", 60_000, 13.0, 8.0, {}),
    "PointAt": ("tests.fixtures.envs:PointAt", 100_000, 11.0, 2.8, {}),
    "SpotTheLight": ("tests.fixtures.envs:SpotTheLight", 60_000, 13.0, 4.0, {}),
    "RememberCue-lstm": ("tests.fixtures.envs:RememberCue", 60_000, 0.9, 0.25,
                         {"recurrent": "lstm", "rnn_size": 64}),
    "MiniGrid-Empty-5x5": ("MiniGrid-Empty-5x5-v0", 60_000, 0.8, 0.1,
                           {"env_import": ("minigrid",), "drop_observations": ("mission",)}),
}


@dataclasses.dataclass
class Settings:
    """Every space hetrl takes, learned."""

    cases: tuple[str, ...] = tuple(CASES)
    inference: tuple[str, ...] = ("worker", "central")
    quick: bool = False
    """MatchCode and SpotTheLight with worker inference only."""


def run(name: str, inference: str) -> dict:
    env, steps, bar, random_play, extra = CASES[name]
    out = common.RESULTS / "runs" / f"spaces-{name}-{inference}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    result = run_local(env=env, total_steps=steps, seed=1, inference=inference, out=str(out),
                       progress=False, report=False, **extra)
    final = result.summary.get("mean_return_100")
    return {"case": name, "inference": inference, "ok": result.ok, "steps": steps,
            "bar": bar, "random_play": random_play, "final_mean_return_100": final,
            "first_step_at_bar": first_reaching(out, bar),
            "passed": bool(result.ok and final is not None and final >= bar),
            "wall_s": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.quick:
        s = dataclasses.replace(s, cases=("MatchCode", "SpotTheLight"), inference=("worker",))
    runs = []
    for name in s.cases:
        for inference in s.inference:
            print(f"{name} ({inference} inference) ...", flush=True)
            runs.append(run(name, inference))
    summary = {"passed": sum(r["passed"] for r in runs), "runs": len(runs),
               "pass": all(r["passed"] for r in runs)}
    rows = [[r["case"], r["inference"], f"{r['steps']:,}", r["random_play"], r["bar"],
             f"{r['first_step_at_bar']:,}" if r["first_step_at_bar"] else "not reached",
             r["final_mean_return_100"], r["wall_s"]] for r in runs]
    common.print_table(
        f"Every space, learned (hetrl local, 2 workers x 8 envs, seed 1): "
        f"{summary['passed']}/{summary['runs']} at the bar at the end: "
        f"{'PASS' if summary['pass'] else 'FAIL'}",
        ["case", "inference", "steps", "random", "bar", "first step at bar",
         "final mean(100)", "wall s"], rows)
    common.write_json("summary_spaces", s, {"runs": runs, "summary": summary})
    return summary


if __name__ == "__main__":
    main()
