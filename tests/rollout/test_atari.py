"""Atari as users know it: ALE ids without a flag, the standard pipeline identical in
training and evaluation, episodic life and clipped rewards for training only (real
ale-py envs)."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from hetrl.rollout import envs as envs_module
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import describe_env, env_spec, make_vector_env
from hetrl.rollout.errors import ConfigError, EnvError
from hetrl.rollout.evaluate import _make_env
from hetrl.rollout.policy import ImageActorCritic, Policy
from hetrl.rollout.rewards import clip_rewards
from hetrl.rollout.settings import EnvSettings, PolicySettings
from tests.helpers import ROOT

pytest.importorskip("ale_py")
pytest.importorskip("cv2")


def test_ale_ids_resolve_without_a_flag_in_a_fresh_process() -> None:
    code = ("import sys; from hetrl.rollout.envs import describe_env; "
            "from hetrl.rollout.settings import EnvSettings; "
            "assert 'ale_py' not in sys.modules; "
            "print(describe_env(EnvSettings(env='ALE/Pong-v5')).observation_space)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Box(0, 255, (210, 160, 3), uint8)" in out.stdout


def test_a_missing_registering_package_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(envs_module, "REGISTERING_PACKAGES",
                        (("Nope/", "no_such_pkg_hetrl", "pip install nope"),))
    with pytest.raises(EnvError) as info:
        describe_env(EnvSettings(env="Nope/Thing-v0"))
    assert str(info.value) == ("--env Nope/Thing-v0: Nope/* ids are registered by the "
                               "no_such_pkg_hetrl package, which is not installed here: "
                               "pip install nope")


def test_the_pipeline_gives_stacked_grayscale_squares_and_its_knobs_change_them() -> None:
    spaces = describe_env(EnvSettings(env="ALE/Breakout-v5", atari=True))
    assert spaces.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert spaces.action_space == gym.spaces.Discrete(4)
    small = describe_env(EnvSettings(env="ALE/Breakout-v5", atari=True, atari_frame_stack=2,
                                     atari_screen_size=64))
    assert small.observation_space.shape == (2, 64, 64)
    spec = env_spec(EnvSettings(env="ALE/Breakout-v5", atari=True, atari_sticky_actions=0.0))
    assert spec.kwargs["frameskip"] == 1 and spec.kwargs["repeat_action_probability"] == 0.0


def test_atari_on_an_env_that_is_not_ale_is_refused() -> None:
    with pytest.raises(EnvError, match="--atari: CartPole-v1 is not an ALE env"):
        describe_env(EnvSettings(env="CartPole-v1", atari=True))


def test_bad_pipeline_knobs_are_refused() -> None:
    with pytest.raises(ConfigError, match="--atari-frame-stack must be >= 1"):
        EnvSettings(env="ALE/Pong-v5", atari=True, atari_frame_stack=0)
    with pytest.raises(ConfigError, match="--atari-sticky-actions"):
        EnvSettings(env="ALE/Pong-v5", atari=True, atari_sticky_actions=1.5)


def _wrappers(env: gym.Env) -> list[str]:
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_training_and_evaluation_play_the_same_env() -> None:
    settings = EnvSettings(env="ALE/Breakout-v5", atari=True)
    vector = make_vector_env(settings, 2, "sync")
    played = _make_env(settings, frames=False)
    try:
        trained_on = vector.envs[0]
        # The worker's sub-env is the evaluation env inside its fault guard.
        assert _wrappers(trained_on)[0] == "EnvGuard"
        assert _wrappers(trained_on)[1:] == _wrappers(played)
        assert "AtariPreprocessing" in _wrappers(played)
        assert "FrameStackObservation" in _wrappers(played)
        assert "FireOnReset" in _wrappers(played)
        # and an env the guard recreates after a fault is made from the same spec
        assert trained_on.env.spec == trained_on._spec == played.spec
        first_trained, _ = trained_on.reset(seed=7)
        first_played, _ = played.reset(seed=7)
        np.testing.assert_array_equal(first_trained, first_played)
    finally:
        vector.close()
        played.close()


def _breakout_fragment(steps: int, episodic_life: bool):
    """A fragment of 2 random-policy Breakout envs, and which games ended on its last
    step (the collector's envs about to reset)."""
    settings = EnvSettings(env="ALE/Breakout-v5", atari=True)
    envs = make_vector_env(settings, 2, "sync")
    policy = Policy(envs.single_observation_space, envs.single_action_space,
                    PolicySettings())
    assert isinstance(policy.net, ImageActorCritic)
    collector = Collector(envs, policy, steps, seed=3, episodic_life=episodic_life)
    try:
        return collector.collect(), collector.builder.autoreset.copy()
    finally:
        envs.close()


def _game_ends(fragment, ended_last: np.ndarray) -> np.ndarray:
    """[T, N]: steps that ended a game (the next step is the reset step)."""
    ends = np.zeros_like(fragment.terminated)
    ends[:-1] = (fragment.terminated | fragment.truncated)[:-1] & ~fragment.valid[1:]
    ends[-1] = ended_last
    return ends


def test_episodic_life_ends_value_targets_while_returns_stay_whole_games() -> None:
    fragment, ended_last = _breakout_fragment(400, episodic_life=True)
    game_ends = _game_ends(fragment, ended_last)
    games = []
    for n in range(2):
        start = 0
        for t in np.flatnonzero(game_ends[:, n]):
            games.append(float(fragment.rewards[start:t + 1, n].sum()))
            start = t + 2  # after the reset step
    assert len(games) >= 2, "random Breakout ends games within 400 steps"
    # Reported returns are whole games in raw points, all five lives of each.
    assert sorted(games) == sorted(fragment.episode_returns.tolist())
    # A lost life is terminal for the value target but no episode: the game goes on.
    lives_lost = fragment.terminated & ~game_ends
    assert lives_lost.sum() >= 4 * len(games)
    assert fragment.valid[1:][lives_lost[:-1]].all()
    plain, ended_last = _breakout_fragment(400, episodic_life=False)
    assert not (plain.terminated & ~_game_ends(plain, ended_last)).any()


def test_clipped_rewards_are_signs() -> None:
    rewards = np.array([[0.0, 4.0], [-2.5, 7.0]], np.float32)
    np.testing.assert_array_equal(clip_rewards(rewards), [[0, 1], [-1, 1]])
    assert clip_rewards(rewards).dtype == np.float32
