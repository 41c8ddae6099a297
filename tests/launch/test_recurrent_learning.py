"""Recurrent policies end to end: real workers (or env servers) and a real learner over
loopback gRPC learn RememberCue, where the answer asked for at step 5 was shown only at
step 1, so a policy without memory can only guess (0.25). Seen (2 workers x 8 envs,
seed 1, two busy loops beside it): --recurrent lstm reached 1.0 by 38k steps, gru with
central inference by 33k; feed-forward read 0.2 at 40k. The tests ask 0.9 at 50k, and
at most 0.45 without a memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetrl.launch import run_local
from tests.helpers import learns_and_plays

CUE, STEPS, THRESHOLD = "tests.fixtures.envs:RememberCue", 50_000, 0.9


@pytest.mark.slow
@pytest.mark.parametrize("recurrent, inference", [("lstm", "worker"), ("gru", "central")])
def test_a_recurrent_policy_remembers_and_its_kept_policy_plays(tmp_path: Path, recurrent: str,
                                                                inference: str) -> None:
    # evaluate() carries the loaded policy's state through each episode
    learns_and_plays(tmp_path / recurrent, CUE, inference, STEPS, THRESHOLD, 0.25,
                     recurrent=recurrent, rnn_size=64)


@pytest.mark.slow
def test_without_a_memory_the_cue_is_a_guess(tmp_path: Path) -> None:
    result = run_local(env=CUE, total_steps=STEPS, seed=1, out=str(tmp_path / "ff"),
                       progress=False, report=False)
    assert result.ok, result.summary
    assert result.summary["mean_return_100"] <= 0.45, result.summary
