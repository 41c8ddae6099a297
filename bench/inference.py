"""Benchmark: central vs worker inference on the same cores, and what the planner says.

For each env (CartPole-v1 with the MLP, Humanoid-v5 with the MLP, Pong with
bench.nets:SmallCNN) it runs `run_local` (the code of `hetrl local`: worker processes,
a learner process, gRPC on loopback) twice, once per placement, with the same workers,
envs per worker and fragment length, and reports env steps/s over the learner's wall
time (global_step / wall_seconds_this_run; start-up excluded, training included). It
also reports the mean update time under each placement (does training slow beside the
inference thread?), the round trip of one EnvStep -> Actions with a real env server on
127.0.0.1 and where `hetrl emulate` puts an env host (127.0.0.3), and the placement
`hetrl plan` picks from its per-step measurements, so the table says whether the
planner agrees with the measured winner. Runs are short (throughput, not learning).
Run: `python -m bench.inference [--quick]`.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import tyro

from bench import common
from hetrl.launch import run_local
from hetrl.launch.placement import loopback_round_trip_us, measure_placement
from hetrl.launch.plan import PlanSettings

CASES = {  # env, policy, env steps per run
    "CartPole-v1": ("CartPole-v1", "", 60_000),
    "Humanoid-v5": ("Humanoid-v5", "", 20_000),
    "pong": ("bench.envs:make_pong", "bench.nets:SmallCNN", 10_000),
}


@dataclasses.dataclass
class Settings:
    """Central vs worker inference, measured end to end on this machine."""

    envs: tuple[str, ...] = ("CartPole-v1", "Humanoid-v5", "pong")
    """Cases to run (keys of CASES)."""
    workers: int = 2
    """Worker processes per run."""
    envs_per_worker: int = 16
    """Envs per worker (central: two groups of half)."""
    fragment_length: int = 32
    """Steps per env per fragment."""
    repeats: int = 1
    """Runs per env and placement."""
    quick: bool = False
    """One env (CartPole) and shorter runs."""


def _run(env: str, policy: str, steps: int, inference: str, s: Settings, root: Path) -> dict:
    out = root / f"{env.replace(':', '_')}-{inference}"
    result = run_local(env=env, policy=policy, workers=s.workers,
                       envs_per_worker=s.envs_per_worker, fragment_length=s.fragment_length,
                       total_steps=steps, inference=inference, out=str(out), progress=False,
                       eval_every=0)
    if not result.ok:
        raise RuntimeError(f"{env} --inference {inference} failed: {result.summary}")
    summary = result.summary
    return {
        "env_steps_per_second": summary["global_step"] / summary["wall_seconds_this_run"],
        # Does training slow down beside central inference? Mean seconds per update.
        "update_ms": 1000 * summary["learner_train_seconds"] / max(1, summary["policy_version"]),
        "learner_waited": summary["learner_wait_seconds"] / summary["wall_seconds_this_run"],
        "policy_lag_histogram": summary["policy_lag_histogram"],
        "inference_rows_per_pass": summary.get("inference_rows_per_pass"),
    }


def _round_trip(env: str, policy: str, s: Settings) -> float:
    """The EnvStep -> Actions round trip to an env server bound where `hetrl emulate`
    puts an env host (algo-3 on 127.0.0.3), from this process."""
    settings = PlanSettings(env=env, policy=policy, envs_per_worker=s.envs_per_worker,
                            fragment_length=s.fragment_length)
    return loopback_round_trip_us(settings, host="127.0.0.3")


def main(s: Settings) -> dict:
    names = ("CartPole-v1",) if s.quick else s.envs
    root = Path(tempfile.mkdtemp(prefix="bench-inference-"))
    records, rows = [], []
    try:
        for name in names:
            env, policy, steps = CASES[name]
            steps = steps // 3 if s.quick else steps
            plan = measure_placement(PlanSettings(env=env, policy=policy,
                                                  envs_per_worker=s.envs_per_worker,
                                                  fragment_length=s.fragment_length))
            runs: dict[str, list[dict]] = {"worker": [], "central": []}
            for _ in range(s.repeats):
                for inference in ("worker", "central"):
                    runs[inference].append(_run(env, policy, steps, inference, s, root))
            worker, central = (common.summarize([r["env_steps_per_second"] for r in runs[k]])
                               for k in ("worker", "central"))
            update = {k: common.summarize([r["update_ms"] for r in runs[k]]) for k in runs}
            winner = "central" if central["median"] > worker["median"] else "worker"
            records.append({"env": name, "policy": policy or "mlp", "steps": steps,
                            "worker_env_steps_per_second": worker,
                            "central_env_steps_per_second": central,
                            "measured_winner": winner, "planner_choice": plan.choice(),
                            "planner": dataclasses.asdict(plan), "runs": runs,
                            "round_trip_us_emulated_host": _round_trip(env, policy, s)})
            rows.append([name, policy or "MLP", common.fmt(worker), common.fmt(central),
                         f"{central['median'] / worker['median']:.2f}x",
                         f"{common.fmt(update['worker'], ',.1f')} / "
                         f"{common.fmt(update['central'], ',.1f')}", winner, plan.choice(),
                         f"{plan.round_trip_us:,.0f} / "
                         f"{records[-1]['round_trip_us_emulated_host']:,.0f}"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    common.print_table(
        f"central vs worker inference, {s.workers} workers x {s.envs_per_worker} envs x "
        f"{s.fragment_length} steps, same cores",
        ["env", "policy", "worker env steps/s", "central env steps/s", "central/worker",
         "update ms worker / central", "measured winner", "planner picks",
         "round trip us 127.0.0.1 / emulated host"], rows)
    agree = all(r["measured_winner"] == r["planner_choice"] for r in records)
    print(f"planner agrees with the measured winner: {'yes' if agree else 'NO'}")
    result = {"results": records, "planner_agrees": agree}
    common.write_json("summary_inference", s, result)  # kept in git
    return result


if __name__ == "__main__":
    main(tyro.cli(Settings))
