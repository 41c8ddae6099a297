"""Dict observations end to end: real workers (or env servers) and a real learner over
loopback gRPC learn SpotTheLight, whose 3x32x32 uint8 image and 2-vector must both be
read (either alone scores 8 of 16; random play 4), through `hetrl local` with worker
and central inference and through `hetrl emulate`; the kept policy plays it through
`load_policy`. Beside two busy loops (2 workers x 8 envs, seed 1), five
central-inference runs reached mean(100) 13 between 16k and 25k steps, three
worker-inference runs at 24k: the tests ask 13 at 80k. MiniGrid, a third-party Dict env
(a 7x7x3 grid and a Discrete direction), learns too when its mission text is dropped
(`--drop-observations mission`, which hetrl's refusal of that text leaf names)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

from hetrl.launch import run_local
from hetrl.rollout.evaluate import evaluate, load_policy
from tests.helpers import hetrl, learns_and_plays

THRESHOLD = 13.0
# 80k steps for every way of running it, three times the steps the runs above needed:
# the env's first version (the vector mirrored the quadrant, an interaction to discover)
# reached 13 near 30k in most runs but sat at 8 past 80k in a CI run of central inference.
STEPS = {"worker": 80_000, "central": 80_000}
EMULATED_STEPS = 80_000


@pytest.mark.slow
@pytest.mark.parametrize("inference", ["worker", "central"])
def test_a_dict_of_image_and_vector_learns_and_its_policy_plays(tmp_path: Path,
                                                                inference: str) -> None:
    # random play scores 4, one leaf alone 8
    learns_and_plays(tmp_path / inference, "tests.fixtures.envs:SpotTheLight", inference,
                     STEPS[inference], THRESHOLD, 4.0)


@pytest.mark.slow
def test_an_emulated_job_learns_dict_observations(tmp_path: Path) -> None:
    out = tmp_path / "spot"
    proc = hetrl("emulate", "--env-hosts", "1", "--env", "tests.fixtures.envs:SpotTheLight",
                 "--total-steps", str(EMULATED_STEPS), "--envs-per-worker", "8", "--out",
                 str(out))
    output, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((out / "hosts" / "algo-2" / "model" / "summary.json").read_text())
    assert summary["mean_return_100"] >= THRESHOLD, summary


@pytest.mark.slow
def test_minigrid_learns_once_its_mission_text_is_dropped(tmp_path: Path) -> None:
    pytest.importorskip("minigrid")
    out = tmp_path / "mg"
    refused = hetrl("local", "--env", "MiniGrid-Empty-5x5-v0", "--env-import", "minigrid",
                    "--out", str(tmp_path / "refused"))
    output, _ = refused.communicate(timeout=120)
    assert refused.returncode == 2, output
    assert "observation leaf 'mission'" in output and "--drop-observations mission" in output
    result = run_local(env="MiniGrid-Empty-5x5-v0", env_import=("minigrid",),
                       drop_observations=("mission",), total_steps=60_000, seed=1,
                       out=str(out), progress=False, report=False)
    assert result.ok, result.summary
    # MiniGrid pays 1 - 0.9 * steps / max_steps on reaching the goal, 0 on time-out;
    # random play on Empty-5x5 averages about 0.1. The run reaches ~0.9 by 40k steps, but
    # with the shipped settings it can fall back after that (seen: 0.89 at 39k, 0.45 at
    # 50k): the kept best policy is what is held to the bar.
    assert result.summary["best"]["mean_return"] >= 0.8, result.summary
    trained = load_policy(out, "best")  # the model remembers to drop the mission
    assert trained.env.drop_observations == ("mission",)
    # Played as trained, sampling its actions: MiniGrid's view does not change when the
    # agent walks into a wall, so an argmax that says "forward" there loops until the
    # time-out (seen in a hogged suite: the best policy, 0.93 sampled, scored 0.0 in 5
    # deterministic episodes, stuck at the wall beside the goal). Sampled, a kept best
    # policy has played 0.73-0.93 over 20 episodes (beside two busy loops): the training
    # mean(100) that chose it spans several versions. Random play scores about 0.1.
    played = evaluate(trained, episodes=30, seed=10)
    assert played.mean_return >= 0.6, played.summary()
    raw, _ = gym.make("MiniGrid-Empty-5x5-v0").reset(seed=0)  # mission and all
    assert 0 <= trained.act(raw, deterministic=True) < 7
