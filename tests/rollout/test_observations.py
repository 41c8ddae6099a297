"""Nested observations: a space's leaves, their trip through collector, wire and checks,
and what the built-in policy makes of each kind of leaf."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrl.protos import hetrl_pb2
from hetrl.rollout import wire
from hetrl.rollout.collector import Collector
from hetrl.rollout.envs import describe_env, make_vector_env
from hetrl.rollout.errors import EnvError, EnvShapeError, WireFormatError
from hetrl.rollout.fragments import (
    FragmentArrays,
    expected_steps,
    from_message,
    nonfinite_fields,
    serialize,
    to_message,
)
from hetrl.rollout.observations import IMAGE, ONE_HOT, ObsLayout
from hetrl.rollout.policy import ImageEncoder, Policy, image_channels_last
from hetrl.rollout.settings import PolicySettings, WorkerSettings

EVERY_LEAF = "tests.fixtures.envs:EveryLeaf"


def test_a_nested_space_is_its_leaves_by_path() -> None:
    space = describe_env(WorkerSettings(env=EVERY_LEAF)).observation_space
    layout = ObsLayout.of(space)
    assert layout.nested
    found = {leaf.name: (leaf.shape, leaf.dtype.str, leaf.encoding) for leaf in layout.leaves}
    assert found == {
        "grid": ((7, 7, 3), "|u1", "image"),
        "robot/joints": ((3,), "<f4", "vector"),
        "robot/mode": ((), "<i8", "one_hot"),
        "flags": ((4,), "|i1", "binary"),
        "parts/0": ((2,), "<i8", "one_hot"),
        "parts/1": ((2, 2), "<f8", "vector"),
    }
    mode = next(leaf for leaf in layout.leaves if leaf.name == "robot/mode")
    assert (mode.sizes, mode.start, mode.width) == ((3,), (1,), 3)
    # the env's own nesting comes back from the leaves
    obs = space.sample()
    back = layout.unflatten(layout.flatten(obs))
    assert back["robot"]["mode"] == obs["robot"]["mode"]
    np.testing.assert_array_equal(back["parts"]["1"], obs["parts"][1])


def test_a_box_is_one_leaf_and_stays_an_array() -> None:
    layout = ObsLayout.of(gym.spaces.Box(-1, 1, (4,), np.float32))
    assert not layout.nested and layout.names == ("",)
    array = np.zeros((2, 4), np.float32)
    assert layout.flatten(array) is array


@pytest.mark.parametrize("space, words", [
    (gym.spaces.Dict({"pos": gym.spaces.Box(0, 1, (2,)), "note": gym.spaces.Text(5)}),
     ["leaf 'note'", "text", "--drop-observations note"]),
    (gym.spaces.Dict({"a": gym.spaces.Tuple((gym.spaces.Box(0, 1, (1,)),
                                               gym.spaces.Sequence(gym.spaces.Discrete(2))))}),
     ["leaf 'a/1'", "Sequence", "Box, Discrete, MultiDiscrete and MultiBinary"]),
    (gym.spaces.Dict({"a/b": gym.spaces.Box(0, 1, (1,))}), ["'a/b'", "rename it"]),
    (gym.spaces.Graph(gym.spaces.Box(0, 1, (2,)), None), ["not supported", "Dict or Tuple"]),
])
def test_a_leaf_hetrl_cannot_feed_is_named_with_what_to_do(space, words) -> None:
    with pytest.raises(EnvError) as info:
        ObsLayout.of(space, "my-env")
    message = str(info.value)
    assert message.startswith("my-env: ")
    for word in words:
        assert word in message, message


def test_drop_observations_drops_a_dict_key_in_every_env_hetrl_makes() -> None:
    settings = WorkerSettings(env=EVERY_LEAF, drop_observations=("flags", "parts"))
    assert set(describe_env(settings).observation_space.spaces) == {"grid", "robot"}
    envs = make_vector_env(settings, 2)
    assert set(envs.single_observation_space.spaces) == {"grid", "robot"}
    # an env recreated after a fault is made from its spec: it drops them too
    guard = envs.envs[0]
    assert set(gym.make(guard._spec).observation_space.spaces) == {"grid", "robot"}
    with pytest.raises(EnvError, match="no key 'flag'; its keys are 'flags', 'grid'"):
        describe_env(WorkerSettings(env=EVERY_LEAF, drop_observations=("flag",)))
    with pytest.raises(EnvError, match="not a Dict"):
        describe_env(WorkerSettings(env="CartPole-v1", drop_observations=("x",)))


def collected(env: str = EVERY_LEAF, n: int = 3, length: int = 5) -> FragmentArrays:
    settings = WorkerSettings(env=env, envs_per_worker=n, fragment_length=length)
    envs = make_vector_env(settings, n)
    policy = Policy(envs.single_observation_space, envs.single_action_space, settings)
    return Collector(envs, policy, length, seed=1).collect()


def test_leaves_travel_through_the_collector_and_the_wire_in_their_own_dtypes() -> None:
    fragment = collected()
    layout = ObsLayout.of(describe_env(WorkerSettings(env=EVERY_LEAF)).observation_space)
    expected = expected_steps(5, 3, layout, (), np.dtype(np.int64))
    for name, (shape, dtype) in expected["observations"].items():
        assert fragment.observations[name].shape == shape
        assert fragment.observations[name].dtype == dtype
    raw = serialize(fragment, 2, "inc", 7, 3, 0.5)
    assert hetrl_pb2.WorkerMessage.FromString(raw) == to_message(fragment, 2, "inc", 7, 3, 0.5)
    received = from_message(hetrl_pb2.WorkerMessage.FromString(raw).fragment, expected)
    for name, array in fragment.observations.items():
        np.testing.assert_array_equal(received.arrays.observations[name], array)
        assert received.arrays.observations[name].dtype == array.dtype
    np.testing.assert_array_equal(received.arrays.actions, fragment.actions)
    assert nonfinite_fields(received.arrays) == []


def test_a_receiver_checks_every_leaf() -> None:
    fragment = collected()
    layout = ObsLayout.of(describe_env(WorkerSettings(env=EVERY_LEAF)).observation_space)
    expected = expected_steps(5, 3, layout, (), np.dtype(np.int64))

    def received(observations):
        fragment.observations = observations
        message = hetrl_pb2.WorkerMessage.FromString(serialize(fragment, 0, "i", 0, 0))
        return from_message(message.fragment, expected)

    good = dict(fragment.observations)
    with pytest.raises(WireFormatError, match="leaves .* expected"):
        received({k: v for k, v in good.items() if k != "grid"})
    with pytest.raises(WireFormatError, match="'robot/joints': got .* float64"):
        received({**good, "robot/joints": good["robot/joints"].astype(np.float64)})
    with pytest.raises(WireFormatError, match="'grid': got"):
        received({**good, "grid": good["grid"][:, :, :6]})
    with pytest.raises(WireFormatError, match="one array where leaves"):
        received(good["grid"])
    # NaN in a float leaf is found and named
    bad = {**good, "parts/1": good["parts/1"].copy()}
    bad["parts/1"][2, 1, 0, 0] = np.nan
    assert nonfinite_fields(received(bad).arrays) == ["observations/parts/1"]


def test_leaves_where_a_box_was_expected_are_refused() -> None:
    fragment = collected()
    expected = expected_steps(5, 3, ObsLayout.box((4,), np.float32), (), np.dtype(np.int64))
    message = hetrl_pb2.WorkerMessage.FromString(serialize(fragment, 0, "i", 0, 0))
    with pytest.raises(WireFormatError, match="leaves where a Box was expected"):
        from_message(message.fragment, expected)


def test_an_env_whose_observation_lacks_a_leaf_is_an_env_error() -> None:
    class Forgetful(gym.Env):
        observation_space = gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2,)),
                                             "b": gym.spaces.Discrete(3)})
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return {"a": np.zeros(2, np.float32), "b": 0}, {}

        def step(self, action):  # from its 2nd step (gymnasium checks the first)
            self.t += 1
            obs = {"a": np.zeros(2, np.float32)} if self.t >= 2 else {"a": np.zeros(2, np.float32),
                                                                        "b": 0}
            return obs, 0.0, False, False, {}

    gym.register("hetrl-test/Forgetful-v0", entry_point=Forgetful)
    try:
        with pytest.raises(EnvShapeError, match=r"leaves \['a'\], where the space has"):
            collected("hetrl-test/Forgetful-v0", n=1)
    finally:
        del gym.registry["hetrl-test/Forgetful-v0"]


# -- fuzz: random nested spaces, random fragments, random damage ------------------------

_LEAF_KINDS = st.sampled_from(["f4", "f8", "u1", "i4", "discrete", "multidiscrete", "bits"])


@st.composite
def _leaf(draw):
    kind = draw(_LEAF_KINDS)
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    if kind == "discrete":
        return gym.spaces.Discrete(draw(st.integers(1, 5)), start=draw(st.integers(-2, 2)))
    if kind == "multidiscrete":
        return gym.spaces.MultiDiscrete(np.full(shape or (1,), draw(st.integers(1, 4))))
    if kind == "bits":
        return gym.spaces.MultiBinary(list(shape or (1,)))
    dtype = np.dtype(kind)
    low, high = (0, 255) if dtype.kind in "iu" else (-1.0, 1.0)
    return gym.spaces.Box(low, high, shape, dtype)


_SPACES = st.recursive(
    _leaf(),
    lambda children: st.one_of(
        st.dictionaries(st.text("abcxyz_", min_size=1, max_size=4), children,
                        min_size=1, max_size=3).map(gym.spaces.Dict),
        st.lists(children, min_size=1, max_size=3).map(lambda parts: gym.spaces.Tuple(parts)),
    ),
    max_leaves=6,
).filter(lambda space: isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)))


@settings(max_examples=60, deadline=None)
@given(space=_SPACES, t_len=st.integers(1, 4), n=st.integers(1, 3), seed=st.integers(0, 99),
       damage=st.sampled_from(["none", "drop", "extra", "dtype", "shape", "box"]))
def test_fuzz_nested_fragments_arrive_whole_or_are_refused(space, t_len, n, seed, damage):
    layout = ObsLayout.of(space)
    rng = np.random.default_rng(seed)
    expected = expected_steps(t_len, n, layout, (), np.dtype(np.int64))
    steps = {}
    for name, shape_dtype in expected.items():
        if name == "observations":
            steps[name] = {leaf: (rng.integers(0, 3, shape).astype(dtype)
                                  if dtype.kind in "iub" else rng.standard_normal(shape
                                                                                  ).astype(dtype))
                           for leaf, (shape, dtype) in shape_dtype.items()}
        elif shape_dtype is not None:  # (a feed-forward policy's recurrent arrays: None)
            shape, dtype = shape_dtype
            steps[name] = rng.integers(0, 2, shape).astype(dtype)
    fragment = FragmentArrays(**steps, episode_returns=np.zeros(1, np.float32),
                              episode_lengths=np.ones(1, np.int64))
    observations = dict(fragment.observations)
    first = layout.names[0]
    if damage == "drop":
        del observations[first]
    elif damage == "extra":
        observations["zz/extra"] = np.zeros((t_len + 1, n), np.float32)
    elif damage == "dtype":
        flipped = np.float16 if observations[first].dtype != np.float16 else np.float32
        observations[first] = observations[first].astype(flipped)
    elif damage == "shape":
        observations[first] = np.zeros((t_len + 1, n + 1), observations[first].dtype)
    sent = FragmentArrays(**{**vars(fragment), "observations": (
        observations[layout.names[-1]] if damage == "box" else observations)})
    raw = serialize(sent, 0, "i", 0, 0)
    assert hetrl_pb2.WorkerMessage.FromString(raw) == to_message(sent, 0, "i", 0, 0, 0.0)
    message = hetrl_pb2.WorkerMessage.FromString(raw).fragment
    if damage == "shape" and observations[first].shape == expected["observations"][first][0]:
        damage = "none"  # the same shape by chance
    if damage != "none":
        with pytest.raises(WireFormatError):
            from_message(message, expected)
        return
    received = from_message(message, expected)
    for leaf in layout.names:
        np.testing.assert_array_equal(received.arrays.observations[leaf],
                                      fragment.observations[leaf])


# -- the built-in policy ------------------------------------------------------------------

@pytest.mark.parametrize("shape, last", [((7, 7, 3), True), ((3, 32, 32), False),
                                         ((84, 84, 4), True), ((4, 84, 84), False),
                                         ((10, 12), True), ((5, 5, 5), True)])
def test_an_image_encoder_fits_small_grids_and_frames_either_way_round(shape, last) -> None:
    assert image_channels_last(shape) is last
    encoder = ImageEncoder(shape)
    out = encoder(torch.rand(2, *shape))
    assert out.shape == (2, ImageEncoder.FEATURES)


def test_choices_are_one_hot_and_images_scaled_before_any_network() -> None:
    space = describe_env(WorkerSettings(env=EVERY_LEAF)).observation_space
    policy = Policy(space, gym.spaces.Discrete(3), PolicySettings())
    layout = policy.obs_layout
    obs = layout.sample(space, 4)
    seen = policy.preprocess({k: torch.from_numpy(v) for k, v in obs.items()})
    mode = seen["robot/mode"]
    assert mode.shape == (4, 3)
    np.testing.assert_array_equal(mode.argmax(1).numpy(), obs["robot/mode"] - 1)  # start 1
    parts = seen["parts/0"]  # MultiDiscrete [2, 3]: 2 + 3 one-hot columns
    assert parts.shape == (4, 5) and torch.all(parts.sum(1) == 2)
    assert seen["grid"].dtype == torch.float32 and float(seen["grid"].max()) <= 1.0
    assert {leaf.name for leaf in layout.leaves if leaf.encoding == IMAGE} == {"grid"}
    assert {leaf.name for leaf in layout.leaves if leaf.encoding == ONE_HOT} == {
        "robot/mode", "parts/0"}
    # only float leaves keep running statistics, and they travel with the weights
    state = policy.state_dict()
    assert {k.rsplit(".", 1)[0] for k in state if k.startswith("leaf_rms.")} == {
        "leaf_rms.leaf:robot/joints", "leaf_rms.leaf:parts/1"}
    dist, value = policy(seen, preprocessed=True)
    assert value.shape == (4,)


def test_a_custom_policy_receives_the_leaves_by_path(tmp_path, monkeypatch) -> None:
    (tmp_path / "mypolicy.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, observation_space, action_space):\n"
        "        super().__init__()\n"
        "        self.head = nn.Linear(3 + 3, 3)\n"
        "        self.seen = None\n"
        "    def forward(self, obs):\n"
        "        self.seen = {k: tuple(v.shape) for k, v in obs.items()}\n"
        "        x = torch.cat([obs['robot/joints'], obs['robot/mode']], 1)\n"
        "        return self.head(x), x.sum(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    space = describe_env(WorkerSettings(env=EVERY_LEAF)).observation_space
    policy = Policy(space, gym.spaces.Discrete(3), PolicySettings(policy="mypolicy:Net"))
    actions, _ = policy.act(policy.obs_layout.sample(space, 2))
    assert actions.shape == (2,)
    assert policy.net.seen["robot/mode"] == (2, 3)  # one-hot
    assert policy.net.seen["grid"] == (2, 7, 7, 3)  # scaled, in the env's own layout


def test_wire_names_are_the_leaf_paths() -> None:
    fragment = collected()
    message = to_message(fragment, 0, "i", 0, 0, 0.0).fragment
    assert [item.name for item in message.observation_leaves] == list(fragment.observations)
    assert not message.HasField("observations")
    assert wire.decode(message.observation_leaves[0].array).shape[:2] == (6, 3)
