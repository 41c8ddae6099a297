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
        ("tests.fixtures.envs:TextInDict", "observation leaf .note. .* text cannot be fed"),
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
    pytest.importorskip("ale_py")  # the atari extra
    # ale-py's own vector env preprocesses frames; workers must not use it silently.
    settings = EnvSettings(env="ALE/Pong-v5", env_import=("ale_py",))
    envs = make_vector_env(settings, 2)
    try:
        assert envs.single_observation_space == describe_env(settings).observation_space
    finally:
        envs.close()


@pytest.fixture
def registered():
    """Register env ids for one test: register(id, entry_point); removed afterwards."""
    ids: list[str] = []

    def register(env_id: str, entry_point) -> None:
        gym.register(env_id, entry_point=entry_point)
        ids.append(env_id)

    yield register
    for env_id in ids:
        del gym.envs.registry[env_id]


def test_misspelled_entry_point_class_suggests_the_close_one() -> None:
    with pytest.raises(EnvError) as info:
        describe_env(EnvSettings(env="tests.fixtures.envs:GoLft"))
    assert str(info.value) == ("--env tests.fixtures.envs:GoLft: module tests.fixtures.envs "
                               "has no GoLft; did you mean GoLeft?")


def test_entry_point_with_nothing_close_lists_what_the_module_defines() -> None:
    with pytest.raises(EnvError) as info:
        describe_env(EnvSettings(env="tests.fixtures.envs:Qwxyzzy"))
    message = str(info.value)
    assert ("module tests.fixtures.envs has no Qwxyzzy, and no env id Qwxyzzy is registered; "
            "its classes and functions include CopyBits, CrashAfter, EveryLeaf") in message
    assert "gym" not in message.partition("include")[2]  # what it imports is no suggestion


def test_entry_point_that_is_not_callable_says_what_it_is() -> None:
    with pytest.raises(EnvError, match=r"its np \(module\) is neither an env class nor a "
                                       r"function that makes one"):
        describe_env(EnvSettings(env="tests.fixtures.envs:np"))


def test_gymnasiums_module_colon_id_form_still_works(registered) -> None:
    # The module registers the id when imported; the id need not be one of its names.
    from tests.fixtures.envs import GoLeft

    registered("HetrlTestRegistered", GoLeft)
    spaces = describe_env(EnvSettings(env="tests.fixtures.envs:HetrlTestRegistered"))
    assert spaces.observation_space.shape == (3,)
    spaces = describe_env(EnvSettings(env="tests.fixtures.envs:hetrl-test/GoLeft-v0"))
    assert spaces.observation_space.shape == (3,)
    with pytest.raises(EnvError, match="in namespace hetrl-test. Did you mean: `GoLeft`?"):
        describe_env(EnvSettings(env="tests.fixtures.envs:hetrl-test/GoLef-v0"))


def test_misspelled_gymnasium_id_keeps_gymnasiums_suggestion() -> None:
    with pytest.raises(EnvError) as info:
        describe_env(EnvSettings(env="CartPol-v1"))
    message = str(info.value)
    assert message.startswith("cannot make env 'CartPol-v1': NameNotFound: Environment "
                              "`CartPol` doesn't exist. Did you mean: `CartPole`?\n")
    assert "gymnasium.pprint_registry()" in message  # and how to find the right id


def _broken_simulator() -> gym.Env:
    raise RuntimeError("simulator licence not found")


def test_a_registered_env_that_fails_is_not_blamed_on_its_id(registered) -> None:
    registered("hetrl-test/Broken-v0", _broken_simulator)
    with pytest.raises(EnvError) as info:
        describe_env(EnvSettings(env="hetrl-test/Broken-v0"))
    message = str(info.value)
    assert "RuntimeError: simulator licence not found" in message
    assert "Check the id" not in message
