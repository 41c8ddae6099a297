"""Every action space hetrl samples, end to end: real workers (or env servers) and a real
learner over loopback gRPC learn envs of the tests' own whose actions are MultiDiscrete
(with an offset start), MultiBinary of shape (2, 3) and a Box of shape (2, 2); the kept
policy plays them through `load_policy`. Thresholds are far above random play and were
reached with room to spare (MatchCode 15.7, CopyBits 15.2-15.4 at 60k steps; PointAt
13.8 at 100k; 2 workers x 8 envs, seed 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import hetrl, learns_and_plays

CASES = {
    # env: (steps, threshold, random play's return)
    "MatchCode": (60_000, 13.0, 4.4),  # MultiDiscrete([4, 4, 3], start=[0, 0, -1])
    "CopyBits": (60_000, 13.0, 8.0),  # MultiBinary([2, 3])
    "PointAt": (100_000, 11.0, 2.8),  # Box(-2, 2, (2, 2))
}


@pytest.mark.parametrize("env, inference", [
    ("MatchCode", "worker"), ("MatchCode", "central"), ("CopyBits", "worker"),
    ("PointAt", "worker"),
])
@pytest.mark.slow
def test_each_action_space_learns_and_its_policy_plays(tmp_path: Path, env: str,
                                                       inference: str) -> None:
    steps, threshold, random_play = CASES[env]
    # The env's own asserts check every action it is given (shape, bounds, start).
    learns_and_plays(tmp_path / env, f"tests.fixtures.envs:{env}", inference, steps,
                     threshold, random_play)


@pytest.mark.slow
def test_an_emulated_job_learns_multidiscrete_actions(tmp_path: Path) -> None:
    out = tmp_path / "md"
    proc = hetrl("emulate", "--env-hosts", "1", "--env", "tests.fixtures.envs:MatchCode",
                 "--total-steps", "60000", "--envs-per-worker", "8", "--out", str(out))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((out / "hosts" / "algo-2" / "model" / "summary.json").read_text())
    assert summary["mean_return_100"] >= CASES["MatchCode"][1], summary
