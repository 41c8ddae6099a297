"""`hetrl local --learners 2`: a learner group of two ranks (gloo on CPU) trains one policy.

The issue's acceptance runs: CartPole-v1 solved for seeds 1-3 with the ranks' weights
identical at every checkpoint and at the end (their checksums are in the checkpoint and
the summary). Marked slow (about 30 s each here); they run in CI all the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hetrl.launch import run_local
from hetrl.rollout.errors import ConfigError
from tests.launch.test_solve import solve_curve


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_learner_ranks_solve_cartpole(tmp_path: Path, seed: int) -> None:
    result = run_local(env="CartPole-v1", workers=2, learners=2, envs_per_worker=8,
                       total_steps=300_000, seed=seed, out=str(tmp_path / f"seed{seed}"),
                       progress=False, report=False, checkpoint_every=3.0,
                       keep_checkpoints=1000)
    summary = result.summary
    assert result.ok, summary
    # A rank knows the others' steps as of the last turn: each may take a fragment past
    # the budget that the others had already spent (two fragments of slack per rank).
    assert summary["global_step"] <= 300_000 + 2 * (2 * 8 * 64), summary["global_step"]
    assert max(solve_curve(result.out)) >= 475, summary
    assert summary["mean_return_100"] >= 475, summary
    group = summary["learner_group"]
    assert group["ranks"] == 2 and group["rank_workers"] == [1, 1]
    assert all(steps > 0 for steps in group["rank_env_steps"])
    assert sum(group["rank_env_steps"]) == summary["global_step"]
    assert group["weights_identical"] and len(group["rank_weights_sha256"]) == 2
    assert group["allreduce_seconds_per_update"] > 0
    # Every checkpoint holds both ranks' checksums, equal.
    checkpoints = sorted((result.out / "checkpoints").glob("ckpt-*.pt"))
    assert len(checkpoints) >= 2
    for path in checkpoints:
        sums = torch.load(path, weights_only=True)["rank_weights_sha256"]
        assert len(sums) == 2 and sums[0] == sums[1], path
    # Rank 1 keeps its own books beside the run's; rank 0's are the run's.
    rank1 = json.loads((result.out / "ranks" / "rank1" / "summary.json").read_text())
    assert rank1["learner_group"]["rank"] == 1
    assert rank1["global_step"] == summary["global_step"]
    assert not (result.out / "ranks" / "rank1" / "model.safetensors").exists()


def test_more_learners_than_workers_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--learners 3 needs at least as many --workers"):
        run_local(env="CartPole-v1", workers=2, learners=3, out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
