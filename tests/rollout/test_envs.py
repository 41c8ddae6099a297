"""Resolving --env the same way everywhere, and clear errors before anything runs."""

import gymnasium as gym
import pytest

from hetrl.rollout.envs import describe_env, make_vector_env
from hetrl.rollout.errors import ConfigError, EnvError
from hetrl.rollout.settings import EnvSettings


def test_registered_id() -> None:
    d = describe_env(EnvSettings(env="CartPole-v1"))
    assert isinstance(d.action_space, gym.spaces.Discrete)
    assert d.observation_space.shape == (4,)


def test_entry_point_class() -> None:
    settings = EnvSettings(env="tests.fixtures.envs:GoLeft")
    assert describe_env(settings).observation_space.shape == (3,)
    envs = make_vector_env(settings, 3)
    assert envs.num_envs == 3
    envs.close()


def test_env_import_registers_id() -> None:
    settings = EnvSettings(env="hetrl-test/GoLeft-v0", env_import=("tests.fixtures.envs",))
    assert describe_env(settings).observation_space.shape == (3,)


def test_box_actions_pendulum() -> None:
    d = describe_env(EnvSettings(env="Pendulum-v1"))
    assert isinstance(d.action_space, gym.spaces.Box)


@pytest.mark.parametrize("mode", ["auto", "sync", "async"])
def test_vector_modes_autoreset_next_step(mode: str) -> None:
    envs = make_vector_env(EnvSettings(env="CartPole-v1"), 2, mode)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    envs.close()


@pytest.mark.parametrize(
    "env, match",
    [
        ("NoSuchEnv-v0", "cannot make env"),
        ("no_such_module:Env", "cannot import no_such_module"),
        ("tests.fixtures.envs:DictObs", "not a Box"),
    ],
)
def test_bad_env_is_a_clear_error(env: str, match: str) -> None:
    with pytest.raises(EnvError, match=match):
        describe_env(EnvSettings(env=env))


def test_bad_env_import() -> None:
    with pytest.raises(EnvError, match="--env-import: cannot import"):
        describe_env(EnvSettings(env="CartPole-v1", env_import=("no_such_pkg_xyz",)))


def test_empty_env_refused() -> None:
    with pytest.raises(ConfigError, match="--env"):
        EnvSettings(env=" ")


def test_atari_workers_simulate_what_the_learner_describes() -> None:
    # ale-py's own vector env preprocesses frames; workers must not use it silently.
    settings = EnvSettings(env="ALE/Pong-v5", env_import=("ale_py",))
    envs = make_vector_env(settings, 2)
    try:
        assert envs.single_observation_space == describe_env(settings).observation_space
    finally:
        envs.close()
