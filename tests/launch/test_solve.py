"""The acceptance runs of the vertical slice: default settings solve CartPole-v1.

Marked slow (about 20 s each here); they run in CI all the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetrl.launch import run_local


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cartpole_solved_within_300k_steps(tmp_path: Path, seed: int) -> None:
    result = run_local(env="CartPole-v1", workers=2, envs_per_worker=8, total_steps=300_000,
                       seed=seed, out=str(tmp_path / f"seed{seed}"), progress=False)
    assert result.ok, result.summary
    # (a stray SIGTERM ends a run with exit 0 once it is honoured: not a solve)
    assert result.summary["outcome"] == "finished", result.summary["outcome"]
    assert result.summary["global_step"] <= 300_000 + 2 * 8 * 64  # one fragment of slack
    # Solved as bench.solve counts it, and still solved at the end: with raw rewards the
    # policy's step was starved and a solved run could end far lower (bench/lag.py).
    assert max(solve_curve(result.out)) >= 475, result.summary
    assert result.summary["mean_return_100"] >= 475, result.summary
    assert result.summary["best"]["mean_return"] >= 475, result.summary


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~75-100 s each on a quiet 2-core machine
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cartpole_solved_within_300k_steps_with_central_inference(tmp_path: Path,
                                                                  seed: int) -> None:
    # The learner chooses every action; workers only step envs. Central inference pays a
    # round trip per env group and step, so it wants more envs per worker (16, in groups
    # of 8) and shorter fragments (32 steps: the same 512 steps per fragment).
    result = run_local(env="CartPole-v1", workers=2, envs_per_worker=16, fragment_length=32,
                       total_steps=300_000, seed=seed, inference="central",
                       out=str(tmp_path / f"central{seed}"), progress=False)
    summary = result.summary
    assert result.ok, summary
    assert summary["outcome"] == "finished", summary["outcome"]
    assert summary["global_step"] <= 300_000 + 2 * 16 * 32
    assert max(solve_curve(result.out)) >= 475, summary
    assert summary["mean_return_100"] >= 475, summary
    # One credit per worker and one fragment per worker per batch: lag 0 or 1, always.
    assert set(summary["policy_lag_histogram"]) <= {"0", "1"}, summary
    assert summary["fragments_dropped_lag"] == 0 and summary["env_steps_malformed"] == 0
    assert summary["inference"] == "central" and summary["inference_passes"] > 0
    settings = json.loads((result.out / "settings.json").read_text())
    assert settings["inference"] == "central" and settings["credits_per_worker"] == 1


@pytest.mark.parametrize(("inference", "credits"), [("worker", 2), ("central", 1)])
def test_synchronous_runs_train_every_fragment_at_lag_0(tmp_path: Path, inference: str,
                                                        credits: int) -> None:
    # --synchronous holds each credit until its fragment's own batch has trained, so
    # every fragment is sampled with the newest weights, busy machine or not, and every
    # batch is every credit of both workers.
    result = run_local(env="CartPole-v1", workers=2, envs_per_worker=4, fragment_length=32,
                       total_steps=12_000, seed=1, inference=inference, synchronous=True,
                       credits_per_worker=credits, out=str(tmp_path / inference),
                       progress=False, report=False, metrics_every=0)
    summary = result.summary
    assert result.ok and summary["outcome"] == "finished", summary
    assert set(summary["policy_lag_histogram"]) == {"0"}, summary
    assert summary["fragments_dropped_lag"] == 0
    rows = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    sizes = [row["charts/fragments_per_batch"] for row in rows
             if "charts/fragments_per_batch" in row]
    assert len(sizes) > 20 and set(sizes[:-1]) == {2.0 * credits}, sizes  # the last: budget


def solve_curve(out: Path) -> list[float]:
    """The run's mean return of the last 100 episodes, record by record: solved, as
    bench.solve counts it, when it reaches 475 (PPO's mean can dip after solving)."""
    return [json.loads(line).get("charts/mean_return_100", 0.0)
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~225 s on a quiet 2-core machine: the preset's 10 x 32 update
def test_pendulum_learns_continuous_control(tmp_path: Path) -> None:
    # The continuous preset (chosen from Pendulum's Box actions) and the README's one
    # Pendulum flag, gamma 0.9. Random play scores about -1200; a shortened run must
    # already be well past -400.
    result = run_local(env="Pendulum-v1", workers=2, envs_per_worker=8, total_steps=160_000,
                       seed=1, gamma=0.9, out=str(tmp_path / "pendulum"), progress=False)

    assert result.ok, result.summary
    assert result.summary["mean_return_100"] > -400, result.summary
    assert json.loads((result.out / "settings.json").read_text())["preset"] == "continuous"
