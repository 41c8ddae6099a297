"""`hetrl local --env ALE/Breakout-v5` with no other flag: the atari preset, the Atari
pipeline, the built-in CNN, frame stacks sent once per frame; then `hetrl enjoy` and
`load_policy` play whole games on the same pipeline (real processes, real ale-py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetrl.launch import run_local
from hetrl.rollout.evaluate import _make_env, evaluate, load_policy
from hetrl.rollout.policy import ImageActorCritic
from tests.helpers import hetrl, learns_and_plays

pytest.importorskip("ale_py")
pytest.importorskip("cv2")


@pytest.fixture(scope="module")
def breakout_run(tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("atari") / "run"
    result = run_local(env="ALE/Breakout-v5", workers=2, envs_per_worker=4,
                       total_steps=2048, out=str(out), progress=False, report=False)
    return out, result


@pytest.mark.slow
def test_an_ale_id_trains_with_the_preset_pipeline_and_cnn(breakout_run) -> None:
    out, result = breakout_run
    assert result.ok, result.summary
    saved = json.loads((out / "settings.json").read_text())
    assert saved["preset"] == "atari" and saved["atari"] and saved["episodic_life"]
    assert saved["clip_rewards"] and not saved["normalize_rewards"]
    assert result.summary["global_step"] >= 2048
    trained = load_policy(out)
    assert isinstance(trained.policy.net, ImageActorCritic)
    assert trained.observation_space.shape == (4, 84, 84)


@pytest.mark.slow
def test_load_policy_plays_whole_games_in_game_points(breakout_run) -> None:
    out, _ = breakout_run
    trained = load_policy(out)
    env = _make_env(trained.env, frames=False)
    try:
        assert env.observation_space.shape == (4, 84, 84)
    finally:
        env.close()
    played = evaluate(trained, episodes=1, seed=3)
    # one whole game of five lives: far longer than a life, scored in points (no clip)
    assert played.lengths[0] >= 100, played.summary()
    assert played.returns[0] == int(played.returns[0]) >= 0


@pytest.mark.slow
def test_enjoy_plays_the_atari_run(breakout_run) -> None:
    out, _ = breakout_run
    proc = hetrl("enjoy", str(out), "--which", "final", "--episodes", "1")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    assert "1 episodes: return" in output


@pytest.mark.slow
def test_central_inference_trains_on_the_same_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "central"
    result = run_local(env="ALE/Breakout-v5", workers=2, envs_per_worker=2,
                       inference="central", total_steps=1024, out=str(out),
                       progress=False, report=False)
    assert result.ok, result.summary
    assert result.summary["global_step"] >= 1024
    assert load_policy(out).observation_space.shape == (4, 84, 84)


@pytest.mark.slow
def test_a_box_of_pixels_that_is_not_atari_learns_with_the_default_cnn(tmp_path: Path) -> None:
    # LitQuadrant: name the lit quadrant of a 3x32x32 image; random play scores 4 of 16.
    # Chosen by its actions (classic); it read 16.0 at 40k steps alone, 37k the best.
    learns_and_plays(tmp_path / "pixels", "tests.fixtures.envs:LitQuadrant", "worker",
                     40_000, 13.0, 4.0)
