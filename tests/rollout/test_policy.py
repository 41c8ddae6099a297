"""The policy: weights as named arrays, action mapping, custom modules."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from hetrl.rollout import wire
from hetrl.rollout.errors import ConfigError, WireFormatError
from hetrl.rollout.policy import Policy, load_policy_arrays, policy_arrays
from hetrl.rollout.settings import PolicySettings

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def _pair(action_space, **kw):
    torch.manual_seed(0)
    a = Policy(OBS, action_space, PolicySettings(**kw))
    torch.manual_seed(1)
    b = Policy(OBS, action_space, PolicySettings(**kw))
    return a, b


@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), gym.spaces.Box(-2, 2, (2,))])
def test_weights_round_trip_over_the_wire(space) -> None:
    a, b = _pair(space)
    a.obs_rms.update(torch.randn(64, 4) * 3 + 1)
    arrays = wire.decode_named(wire.encode_named(policy_arrays(a)))
    load_policy_arrays(b, arrays)
    obs = torch.randn(5, 4)
    for (ha, va), (hb, vb) in [(a.heads(obs), b.heads(obs))]:
        torch.testing.assert_close(ha, hb)
        torch.testing.assert_close(va, vb)


def test_weights_mismatch_is_refused() -> None:
    a, _ = _pair(gym.spaces.Discrete(3))
    other = Policy(OBS, gym.spaces.Discrete(3), PolicySettings(hidden_sizes=(32,)))
    with pytest.raises(WireFormatError, match="weight|missing"):
        load_policy_arrays(a, policy_arrays(other))


def test_non_finite_weights_are_refused() -> None:
    a, b = _pair(gym.spaces.Discrete(3))
    arrays = policy_arrays(a)
    name = next(k for k in arrays if k.endswith("weight"))
    arrays[name][0, 0] = np.nan
    with pytest.raises(WireFormatError, match="NaN"):
        load_policy_arrays(b, arrays)


def test_box_actions_clip_and_rescale_to_bounds() -> None:
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))
    policy = Policy(OBS, space, PolicySettings())
    raw = np.array([[-5.0, 0.0], [1.0, 5.0], [0.5, -1.0]], dtype=np.float32)
    np.testing.assert_allclose(
        policy.env_actions(raw), [[-2.0, 5.0], [2.0, 10.0], [1.0, 0.0]], rtol=1e-6
    )


def test_act_shapes_and_logprobs() -> None:
    policy = Policy(OBS, gym.spaces.Box(-1, 1, (2,)), PolicySettings())
    actions, logp = policy.act(np.zeros((7, 4), np.float32))
    assert actions.shape == (7, 2) and logp.shape == (7,)
    dist, _ = policy(torch.zeros(7, 4))
    expected = dist.log_prob(torch.from_numpy(actions)).detach().numpy()
    np.testing.assert_allclose(expected, logp, rtol=1e-5, atol=1e-6)


MULTI_SPACES = {
    "discrete from 1": gym.spaces.Discrete(3, start=1),
    "multidiscrete": gym.spaces.MultiDiscrete([4, 2, 3], start=[0, 0, -1]),
    "multidiscrete 2-d": gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "multibinary 2x3": gym.spaces.MultiBinary([2, 3]),
    "box 2x2": gym.spaces.Box(-2.0, 2.0, (2, 2), np.float32),
}


@pytest.mark.parametrize("name", MULTI_SPACES)
def test_every_action_space_samples_flat_and_steps_in_its_own_shape(name: str) -> None:
    from hetrl.rollout.envs import action_dtype, action_shape

    space = MULTI_SPACES[name]
    space.seed(0)
    torch.manual_seed(0)
    policy = Policy(OBS, space, PolicySettings())
    actions, logp = policy.act(np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32))
    # What is trained and sent: flat, in the action dtype, one log-prob per action.
    assert actions.shape == (64, *action_shape(space)) and logp.shape == (64,)
    assert actions.dtype == action_dtype(space)
    dist, _ = policy(torch.zeros(64, 4))
    assert dist.log_prob(torch.from_numpy(actions)).shape == (64,)
    assert dist.entropy().shape == (64,)
    # What the env gets: every action in its space, in its own shape.
    stepped = policy.env_actions(actions)
    assert stepped.shape == (64, *space.shape)
    for action in stepped:
        assert space.contains(action.astype(space.dtype)), (name, action)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        # every value of every choice is reachable from a uniform policy
        flat = stepped.reshape(64, -1)
        starts = np.broadcast_to(space.start, space.shape).reshape(-1) if space.shape else \
            [space.start]
        sizes = space.nvec.reshape(-1) if isinstance(space, gym.spaces.MultiDiscrete) else \
            [space.n]
        for i, (start, n) in enumerate(zip(starts, sizes, strict=True)):
            assert set(flat[:, i].tolist()) == set(range(start, start + n)), (name, i)


def test_unsupported_action_spaces_name_the_space_and_what_to_do() -> None:
    from hetrl.rollout.envs import check_spaces
    from hetrl.rollout.errors import EnvError

    with pytest.raises(EnvError, match="Text actions cannot be sampled.*Discrete choice"):
        check_spaces(OBS, gym.spaces.Text(8), "my-env")
    nested = gym.spaces.Dict({"move": gym.spaces.Box(-1, 1, (2,)),
                              "fire": gym.spaces.Discrete(2)})
    with pytest.raises(EnvError, match="Nested actions are not supported yet.*ActionWrapper"):
        check_spaces(OBS, nested, "my-env")


def test_uint8_observations_are_scaled_not_normalized() -> None:
    space = gym.spaces.Box(0, 255, (4, 4), np.uint8)
    policy = Policy(space, gym.spaces.Discrete(2), PolicySettings())
    assert policy.obs_rms is None
    x = torch.full((1, 4, 4), 255, dtype=torch.uint8)
    assert float(policy.preprocess(x).max()) == pytest.approx(1.0)


def test_custom_module() -> None:
    settings = PolicySettings(policy="tests.fixtures.nets:TinyNet")
    policy = Policy(OBS, gym.spaces.Discrete(2), settings)
    actions, _ = policy.act(np.zeros((3, 4), np.float32))
    assert actions.shape == (3,)
    assert any(k.startswith("net.body") for k in policy.state_dict())


def test_custom_module_errors() -> None:
    with pytest.raises(ConfigError, match="cannot import"):
        Policy(OBS, gym.spaces.Discrete(2), PolicySettings(policy="nope_mod:Net"))
    with pytest.raises(ConfigError, match="my_pkg.my_mod:MyNet"):
        PolicySettings(policy="just_a_name")


def test_env_actions_reach_the_env_in_its_dtype_and_never_alias_what_is_trained() -> None:
    from hetrl.rollout.envs import in_space_dtype

    space = gym.spaces.MultiDiscrete([3, 3], dtype=np.int32)
    policy = Policy(OBS, space, PolicySettings())
    actions, _ = policy.act(np.zeros((4, 4), np.float32))
    stepped = in_space_dtype(policy.env_actions(actions), space)
    assert stepped.dtype == np.int32 and all(space.contains(a) for a in stepped)
    bits = Policy(OBS, gym.spaces.MultiBinary(3), PolicySettings())
    sampled, _ = bits.act(np.zeros((4, 4), np.float32))
    given = bits.env_actions(sampled)
    given += 1  # an env that changes its action in place
    assert set(np.unique(sampled)) <= {0, 1}
    rounded = in_space_dtype(np.array([[2.6, -0.4]], np.float32), gym.spaces.Box(-5, 5, (2,), int))
    assert rounded.dtype == np.int64 and rounded.tolist() == [[3, 0]]
