"""Wall-time speed against CleanRL's ppo_continuous_action.py, side by side on this machine.

CleanRL's script is not shipped with hetrl: pass the path of your copy (from
github.com/vwxyzjn/cleanrl, cleanrl/ppo_continuous_action.py). It runs unmodified in
its own process with its own defaults (1 env x 2,048 steps, 10 epochs x 32 minibatches,
its torch thread default; the record keeps the script's sha256), through a shim that
only lets its `TransformObservation(env, func)` call work on gymnasium >= 1.0 (which
added a third argument); then `hetrl local` runs the same env, steps and seed with the preset hetrl
picks (continuous: the same update settings). The two alternate, `--repeats` times.

Reported per side, median [min-max] over repeats: env steps/s by the run's own clock
(CleanRL's last printed SPS; hetrl's learner wall seconds, from its first weights to
the end) and by the whole process wall time (imports, env and process start-up
included), and the ratios hetrl / CleanRL. Both runs see the same machine; the load
from other processes is recorded beside each. Run:
`python -m bench.versus_cleanrl --cleanrl-script PATH [--env HalfCheetah-v5]
[--total-steps 20480] [--repeats 2]`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tyro

from bench import common
from hetrl.launch import run_local

# Runs CleanRL's script as __main__ after adapting one gymnasium call (see the docstring).
_SHIM = """
import runpy, sys
import gymnasium as gym
_Transform = gym.wrappers.TransformObservation
class TransformObservation(_Transform):
    def __init__(self, env, func, observation_space=None):
        super().__init__(env, func, observation_space)
gym.wrappers.TransformObservation = TransformObservation
script = sys.argv.pop(1)
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
"""


@dataclasses.dataclass
class Settings:
    """hetrl vs CleanRL's ppo_continuous_action.py: env steps/s on the same machine."""

    cleanrl_script: Path = Path("ppo_continuous_action.py")
    """Path of CleanRL's cleanrl/ppo_continuous_action.py."""
    env: str = "HalfCheetah-v5"
    """MuJoCo env both run."""
    total_steps: int = 20_480
    """Env steps per run (10 of CleanRL's 2,048-step iterations)."""
    repeats: int = 2
    """CleanRL/hetrl pairs, alternating."""
    seed: int = 1
    """Seed of both."""
    workers: int = 2
    """hetrl's worker processes (one per core here)."""


def run_cleanrl(s: Settings) -> dict:
    with tempfile.TemporaryDirectory(prefix="cleanrl-") as cwd:  # its runs/ go here
        load = common.ForeignLoad([os.getpid()], children=True).start()
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _SHIM, str(s.cleanrl_script.resolve()), "--env-id", s.env,
             "--total-timesteps", str(s.total_steps), "--seed", str(s.seed), "--no-cuda"],
            cwd=cwd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        foreign = load.stop()
    if done.returncode != 0:
        raise RuntimeError(f"CleanRL's script failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    sps = [int(v) for v in re.findall(r"^SPS: (\d+)", done.stdout, re.M)]
    if not sps:
        raise RuntimeError("CleanRL's script printed no 'SPS:' line: is it "
                           f"ppo_continuous_action.py?\n{done.stdout[-2000:]}")
    steps = s.total_steps // 2048 * 2048  # whole iterations of 1 env x 2,048 steps
    return {"steps_per_s": float(sps[-1]), "wall_s": wall, "steps_per_s_wall": steps / wall,
            "foreign_load": foreign}


def run_hetrl(s: Settings) -> dict:
    out = common.RESULTS / "runs" / f"versus-cleanrl-{s.env}"
    shutil.rmtree(out, ignore_errors=True)
    load = common.ForeignLoad([os.getpid()], children=True).start()
    start = time.perf_counter()
    result = run_local(env=s.env, seed=s.seed, workers=s.workers, total_steps=s.total_steps,
                       out=str(out), progress=False)
    wall = time.perf_counter() - start
    foreign = load.stop()
    if not result.ok:
        raise RuntimeError(f"hetrl's run failed: {result.summary}")
    steps = result.summary["global_step"]
    return {"steps_per_s": steps / result.summary["wall_seconds"], "wall_s": wall,
            "steps_per_s_wall": steps / wall, "foreign_load": foreign}


def main(argv: list[str] | None = None) -> dict:
    s = tyro.cli(Settings, args=argv, description=__doc__)
    if s.total_steps < 2048:
        raise SystemExit("--total-steps must be at least CleanRL's one iteration, 2048")
    if not s.cleanrl_script.is_file():
        raise SystemExit(f"--cleanrl-script {s.cleanrl_script}: no such file; get "
                         "cleanrl/ppo_continuous_action.py from github.com/vwxyzjn/cleanrl")
    runs: dict[str, list[dict]] = {"cleanrl": [], "hetrl": []}
    for i in range(s.repeats):
        print(f"repeat {i + 1}/{s.repeats}: CleanRL ...", flush=True)
        runs["cleanrl"].append(run_cleanrl(s))
        print(f"repeat {i + 1}/{s.repeats}: hetrl ...", flush=True)
        runs["hetrl"].append(run_hetrl(s))
    summary: dict = {}
    for side, mine in runs.items():
        summary[side] = {k: common.summarize([r[k] for r in mine])
                         for k in ("steps_per_s", "steps_per_s_wall", "wall_s", "foreign_load")}
    for clock in ("steps_per_s", "steps_per_s_wall"):
        summary[f"ratio_{clock}"] = common.summarize(
            [h[clock] / c[clock] for h, c in zip(runs["hetrl"], runs["cleanrl"], strict=True)])
    rows = [[side, common.fmt(summary[side]["steps_per_s"]),
             common.fmt(summary[side]["steps_per_s_wall"]),
             common.fmt(summary[side]["wall_s"], ".1f"),
             common.fmt(summary[side]["foreign_load"], ".2f")] for side in runs]
    rows.append(["hetrl / CleanRL", common.fmt(summary["ratio_steps_per_s"], ".2f"),
                 common.fmt(summary["ratio_steps_per_s_wall"], ".2f"), "", ""])
    common.print_table(
        f"{s.env}, {s.total_steps:,} env steps, seed {s.seed}: hetrl ({s.workers} workers, "
        "preset) vs CleanRL ppo_continuous_action.py",
        ["", "env steps/s (run clock)", "env steps/s (process wall)", "wall s",
         "other load (cores)"], rows)
    # The committed record (bench/results/summary*.json are kept in git).
    script = {"path": str(s.cleanrl_script),
              "sha256": hashlib.sha256(s.cleanrl_script.read_bytes()).hexdigest()}
    common.write_json(f"summary_versus_cleanrl-{s.env}-{s.total_steps}", s,  # per env and length
                      {"cleanrl_script": script, "runs": runs, "summary": summary})
    return summary


if __name__ == "__main__":
    main()
