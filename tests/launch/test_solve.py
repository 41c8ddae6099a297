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
    assert result.summary["global_step"] <= 300_000 + 2 * 8 * 64  # one fragment of slack
    assert result.summary["mean_return_100"] >= 475, result.summary


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
